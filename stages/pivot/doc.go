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
//
// Its second part is the Mover: four steps (pause the source, copy into
// the target owners first with owner references rewritten and status
// copied, unpause the target, clean the source down to paused mirrors of
// the Clusters, Machines and the deployment), each safe to run again, so
// that a move stopped after any object resumes from the last step it
// recorded and ends as an uninterrupted one (move_test.go kills it after
// objects of every step).
//
// Run is the one driver of a move, for the pivot stage and `capstan
// pivot` alike: it resumes after the phase the deployment's status.pivot
// records, discovers what moves (Discover), builds the graph, runs the
// Preflight (every reason the move cannot finish, at once), records the
// start and then each phase, and keeps in the source what the one mirror
// rule says stays. The fencing record (CheckFence, HandFence) is a Lease
// per deployment naming the Capstan that owns it; FencedError and
// PreflightProblem classify themselves in the failure vocabulary.
package pivot
