// Package manifests holds what installs Capstan into a cluster: its CRDs
// (generated from api/ by `make generate`), RBAC and Deployment, and what
// watches it: alert rules and a Grafana dashboard. They are embedded so
// that the binary can install itself (capstan dev, pivot) and tests can
// load them without knowing the repository layout.
package manifests

import "embed"

// Kustomization holds kustomization.yaml and everything it lists: what
// `kubectl apply -k manifests/` and `capstan install` apply, and the
// components an install may add (components/tenancy, the multi-tenant
// install of `capstan install --tenancy`).
//
//go:embed kustomization.yaml crds/*.yaml install/*.yaml components/*/*.yaml
var Kustomization embed.FS

// CRDs holds crds/*.yaml.
//
//go:embed crds/*.yaml
var CRDs embed.FS

// Install holds install/*.yaml: namespace, RBAC and Deployment.
//
//go:embed install/*.yaml
var Install embed.FS

// Alerts holds the alert rules: alerts/capstan.rules.yaml (a Prometheus
// rules file) and alerts/prometheusrule.yaml (the same rules for the
// Prometheus Operator). Their runbooks are in docs/alerts.md.
//
//go:embed alerts/capstan.rules.yaml alerts/prometheusrule.yaml
var Alerts embed.FS

// Dashboards holds dashboards/*.json, Grafana dashboards over Capstan's
// metrics.
//
//go:embed dashboards/*.json
var Dashboards embed.FS
