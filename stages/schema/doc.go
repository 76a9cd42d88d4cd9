// Package schema checks rendered objects against the schemas a cluster
// serves, with the API server's own machinery, for the objects a
// server-side dry run cannot reach yet (their namespace or their CRD is
// created by an earlier stage of the same plan) and for `capstan
// validate` offline.
//
// Built-in kinds go through structured-merge-diff's typed conversion of
// the cluster's OpenAPI v3 document (managedfields.NewTypeConverter, what
// server-side apply parses an object with): unknown fields and wrong
// types. Custom resources go through the apiextensions-apiserver code a
// CRD's openAPIV3Schema is enforced with: pruning (unknown fields), the
// OpenAPI schema validator (types, required fields, enums, patterns,
// bounds) and the CEL validator of x-kubernetes-validations.
//
// The package returns problems; the stages package decides what they
// mean for a revision.
package schema
