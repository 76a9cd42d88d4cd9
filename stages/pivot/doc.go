// Package pivot moves a cluster's management objects from the cluster
// that built it (the bootstrap cluster) into the cluster itself, the
// `pivot` stage of the bootstrap profile (seed 000 steps 9 to 11, seed 001
// "Cluster Pivoted"), as clusterctl move does and with what the seeds add.
//
// Its first part is the move graph (BuildGraph): what moves with a
// deployment, why each object moves, the order in which a move creates the
// objects in the target (owners first, so that owner references can be
// rewritten to the new UIDs) and deletes them from the source (the other
// way round), and what it pauses first. It is a pure function of the
// objects the source cluster has, so that `capstan pivot --dry-run` and a
// resumed move print the same plan.
package pivot
