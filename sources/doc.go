// Package sources defines where Capstan reads cluster definitions from. A
// Source answers two questions: what is the remote revision now (cheap, asked
// on every poll) and what does it contain (an Artifact, fetched only when the
// revision moved). Sub-packages implement it for git, OCI and local folders.
// Everything downstream (render, stages) only ever sees an Artifact.
package sources
