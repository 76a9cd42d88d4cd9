// Package archtest holds no code: its test reads the module's import graph
// with `go list` and fails when a package breaks the dependency rule of
// docs/architecture.md, so the rule is checked by `make test` instead of
// kept by convention.
package archtest
