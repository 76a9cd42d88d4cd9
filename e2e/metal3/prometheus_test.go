package metal3

// shippedRules is the plain rules file Capstan ships; promtest runs a real
// Prometheus with it.
const shippedRules = "../../manifests/alerts/capstan.rules.yaml"
