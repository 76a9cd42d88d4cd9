package main

import (
	"github.com/spf13/cobra"
)

func newRootCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "capstan",
		Short: "Capstan reconciles clusters from git, stage by stage",
		Long: `Capstan reads cluster definitions from git, renders their kustomize overlays
and applies them with server-side apply, one stage after the other, recording
every stage's progress in the ClusterDeployment's status.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.AddCommand(newRunCommand(), newStatusCommand(), newGetCommand(), newSuspendCommand(), newResumeCommand(), newReconcileCommand(), newEventsCommand(), newRenderCommand(), newDiffCommand(), newValidateCommand(), newPushCommand(), newProfilesCommand(), newDevCommand(), newInstallCommand(), newUninstallCommand(), newPivotCommand(), newVersionCommand())
	return cmd
}
