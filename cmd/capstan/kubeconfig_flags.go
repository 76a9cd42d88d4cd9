package main

import (
	"github.com/spf13/pflag"

	"github.com/capstan-dev/capstan/stages"
)

// kubeconfigFlags say what a kubeconfig read from a Secret may hold
// beyond what only connects (docs/kubeconfigs.md). Flux's names; both
// off by default.
type kubeconfigFlags struct {
	policy stages.KubeconfigPolicy
}

func (f *kubeconfigFlags) BindFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&f.policy.AllowExec, "insecure-kubeconfig-exec", false,
		"let kubeconfig Secrets run credential plugins (exec) and auth-providers: the command runs in Capstan's pod, with its environment and files, for whoever may write such a Secret")
	fs.BoolVar(&f.policy.AllowInsecureTLS, "insecure-kubeconfig-tls", false,
		"let kubeconfig Secrets turn off the verification of the server's certificate (insecure-skip-tls-verify)")
}
