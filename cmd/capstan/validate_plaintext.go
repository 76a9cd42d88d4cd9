package main

import (
	"fmt"

	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// plaintextProblems warns about every Secret of the render that is not
// encrypted in git, so that a plaintext password is caught in the pull
// request before it is merged. A Secret is encrypted in git when its file
// is a sops file, or when every file its generator reads is one; this
// does not need the key, so validate without --decryption-key judges the
// same. A Secret annotated capstan.dev/plaintext: allowed is left alone.
// They are warnings: validate's exit code does not change.
func plaintextProblems(rendered *render.Result) []preflight.Problem {
	var out []preflight.Problem
	for i, obj := range rendered.Objects {
		if obj.GetKind() != "Secret" || obj.GroupVersionKind().Group != "" {
			continue
		}
		ann := obj.GetAnnotations()
		if rendered.FromEncrypted(i) || render.IsDecrypted(ann) || ann[render.PlaintextAnnotation] == render.PlaintextAllowed {
			continue
		}
		name := obj.GetName()
		if ns := obj.GetNamespace(); ns != "" {
			name = ns + "/" + name
		}
		msg := fmt.Sprintf("committed in plaintext, not encrypted with sops; encrypt it (docs/secrets.md), or annotate it %s: %s if it holds nothing secret",
			render.PlaintextAnnotation, render.PlaintextAllowed)
		if i < len(rendered.Files) && rendered.Files[i] != "" {
			msg += " (in " + rendered.Files[i] + ")"
		}
		out = append(out, preflight.Problem{Object: "Secret " + name, Field: "data", Message: msg, Warning: true})
	}
	return out
}
