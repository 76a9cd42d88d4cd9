package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/capstan-dev/capstan/stages"
)

func newProfilesCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "profiles",
		Short: "List and print the built-in stage plans",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the built-in profiles",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tSTAGES\tDESCRIPTION")
			for _, name := range stages.Profiles() {
				p, err := stages.LoadProfile(name)
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "%s\t%d\t%s\n", p.Name, len(p.Stages), p.Description)
			}
			return w.Flush()
		},
	}, &cobra.Command{
		Use:   "show NAME",
		Short: "Print a built-in profile as YAML, to copy into a ClusterDeployment's stages",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := stages.ProfileYAML(args[0])
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(data)
			return err
		},
	})
	return cmd
}
