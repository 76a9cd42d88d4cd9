package main

import (
	"github.com/spf13/pflag"

	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/reconciler/report"
)

// reportFlags configure status commits (docs/report.md).
type reportFlags struct {
	opts reconciler.ReportOptions
}

func (f *reportFlags) BindFlags(fs *pflag.FlagSet) {
	d := report.DefaultOptions()
	fs.StringVar(&f.opts.StatusBranch, "status-branch", "", `commit the status of every ClusterDeployment of the root source to this branch of the root repository (e.g. capstan/status; never the branch it reads), with the root source's credentials; the only branch those credentials commit to (docs/root-source.md); empty: only deployments with spec.report.gitStatus and credentials of their own commit theirs`)
	fs.DurationVar(&f.opts.Interval, "status-interval", d.Interval, "coalescing window of status commits: at most one commit per ClusterDeployment per interval (spec.report.gitStatus.interval overrides it)")
	fs.StringVar(&f.opts.AuthorName, "git-author-name", d.AuthorName, "author and committer name of status commits")
	fs.StringVar(&f.opts.AuthorEmail, "git-author-email", d.AuthorEmail, "author and committer email of status commits")
}
