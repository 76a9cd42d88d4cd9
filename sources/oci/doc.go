// Package oci is the OCI artifact implementation of sources.Source, for
// cluster definitions shipped the way `flux push artifact` (or `capstan
// push artifact`) ships them: one gzip-compressed tar layer under a config
// of media type application/vnd.cncf.flux.config.v1+json. A plain image of
// a single tar+gzip layer is read too.
//
// A Source follows a tag, the highest tag within a semver range, or a
// pinned digest of one repository (oci://host/path). Revision asks the
// registry for the manifest's digest with one HEAD request (plus one tag
// listing for a semver range) over a transport kept between polls, so an
// unchanged poll downloads nothing. Fetch downloads the manifest and the
// layer, bounded by a download limit, and streams it through UnpackInto
// into a sources.Builder (on disk when Options.CacheDir is set), counting
// the decompressed bytes as they come: paths that are absolute or climb
// out, links that leave the artifact, device files and content over the
// limits are refused, and a gzip bomb stops at the limit.
// The revision is "<tag>@sha256:<hex>" ("sha256:<hex>" for a digest pin).
//
// Credentials come from a docker config (Auth.DockerConfig, the content of
// a kubernetes.io/dockerconfigjson Secret), never from the URL, and never
// appear in errors. Push packs a directory into the same format, for the
// `capstan push artifact` command.
package oci
