package main

import capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"

// formatRevision shortens a revision for people (main@sha1:1a2b3c4d): the
// one rule of capstanv1.ShortRevision, which status.summary.revision
// holds for kubectl too.
var formatRevision = capstanv1.ShortRevision
