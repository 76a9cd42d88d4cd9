// Package examples holds no code: it is the example cluster repository
// (README.md). This file encrypts the examples' BMC credentials with the
// demo age key when one of them is written in plaintext; files encrypted
// already are left as they are.
package examples

//go:generate go run ../internal/sopstest/sopsencrypt -key DEMO-KEY-NOT-SECRET.agekey clusters/mgmt/overlay/bmc-credentials.yaml clusters/workload-east/overlay/bmc-credentials.yaml clusters/bootstrap/overlay/cluster/bmc-credentials.yaml clusters/bootstrap/overlay/target/iam-admin.yaml
