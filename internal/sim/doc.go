// Package sim plays the controllers Capstan drives but does not run: the
// Cluster API core controllers, the kubeadm bootstrap and control-plane
// providers, the Metal3 infrastructure provider (CAPM3) and the BareMetal
// Operator, and, in lcm.go, the LCM agent.
//
// Capstan applies Cluster API and Metal3 objects and waits until their
// status says each stage is done. In tests and in `capstan dev` no provider
// runs, so a Simulator watches the real objects in a real kube-apiserver
// and writes what those controllers would write, in the order of seed 002:
// hosts are registered and inspected, the Metal3Cluster accepts its
// endpoint, the Cluster's infrastructure is provisioned, the control plane
// creates its first Machine, CAPM3 picks a host, the host is provisioned,
// the node joins with providerID metal3://<host uid>, the other control
// plane machines follow one at a time, then the workers, and finally the
// Cluster is Available. Every step waits a configurable delay; faults hold
// a host in provisioning or make its first provisioning fail.
//
// The simulator writes status through the status subresource and never
// writes a spec field a user owns: the BareMetalHost fields CAPM3 sets
// (consumerRef, image, userData, metaData, networkData) and the Cluster's
// controlPlaneEndpoint go through server-side apply under the simulated
// controller's own field manager; the objects it creates (Machines,
// MachineSets, Metal3Machines, KubeadmConfigs, Metal3Data) are its own.
//
// docs/simulator.md lists what each simulated controller writes.
package sim
