package report

import (
	"strings"

	"github.com/capstan-dev/capstan/stages"
)

// writeSecrets names, above the collapsed diff, the Secrets the revision
// would create, change or delete: a reviewer sees that a credential
// changes (a rotation, or one that should not) without opening the
// details, and without a value, which the diff never shows for a Secret
// (nor for any document Capstan decrypted).
func writeSecrets(b *strings.Builder, d *stages.PlanDiff) {
	var names []string
	add := func(o stages.ObjectDiff) {
		if o.Kind != "Secret" || o.APIVersion != "v1" {
			return
		}
		switch o.Action {
		case stages.DiffCreate:
			names = append(names, code(o.Ref)+" (new)")
		case stages.DiffChange:
			names = append(names, code(o.Ref)+" (changed)")
		case stages.DiffDelete:
			names = append(names, code(o.Ref)+" (deleted)")
		}
	}
	for _, s := range d.Stages {
		for _, o := range s.Objects {
			add(o)
		}
	}
	for _, o := range d.Prune {
		add(o)
	}
	if len(names) == 0 {
		return
	}
	b.WriteString("**Secrets that change** (their values are never shown): " + strings.Join(names, ", ") + ".\n\n")
}
