// Package reconcile is the core of the agent: the loop that converges the
// node to the geometry its label names, one pass as a checklist of named
// steps, the outcome of a change written in one place, the change's state
// machine and the reboot decision.
//
// Where to look:
//   - run.go: the loop (Run, loop, pass): a pass on every trigger, retry and
//     drift tick. daemon.go: reconcile, which decides whether a pass acts.
//   - attempt.go: a change as a checklist of named steps (plan, checkNode,
//     awaitReboot, begin, takeSlot, drain, checkProcesses, stopHostClients,
//     noteDevicePlugins, apply, finish); a step fails with a StepError, and
//     conclude turns the end of the checklist into the pass's outcome.
//   - end.go: the one exit of a change: its record (written by the
//     Cluster: kube/record.go), state, Event, metrics and journal.
//   - reboot.go: the reboot decision (the one caller of Rebooter.Reboot).
//   - ports.go: the core's own types (Node, Request, Status) and every way
//     it reaches the world (Cluster, Disruptor, Metrics, Slots, ...).
//   - which pods a change affects: gpus/takes.go, used by the drain step.
//   - core_test.go: the core on the simulator with a fake clock and the
//     fakes of its ports (testkit/testsupport).
//
// It may import geometry, gpus, journal, record, settings, nvmlx and
// internal/backoff; never client-go (go list -deps shows no k8s.io package
// but k8s.io/utils/clock) nor Prometheus (its metric values are its own).
package reconcile
