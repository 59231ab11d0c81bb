// Package agent is the node agent: the reconcile loop that converges a node
// to the geometry its label names, the on-disk journal that makes every step
// resumable, the Kubernetes adapters (node watch, labels, annotations,
// ConfigMap, Events, Leases) and the audit records.
//
// Where to look:
//   - run.go: the loop (Run, loop, pass): a pass on every trigger, retry and
//     drift tick. daemon.go: reconcile, which decides whether a pass acts;
//     the failure path and the records.
//   - attempt.go: a change as a checklist of named steps (plan, checkNode,
//     awaitReboot, begin, takeSlot, drain, checkProcesses, stopHostClients,
//     noteDevicePlugins, apply, finish); a step fails with a StepError, and
//     conclude turns the end of the checklist into the pass's outcome.
//   - journal.go: the journal (Change and its Phase; Progress: applied,
//     handled and the backoff of a failing change).
//   - cluster.go: the Kubernetes side behind one interface, Cluster (Kube
//     over client-go in kube.go, Standalone without Kubernetes); the pods a
//     change disturbs behind Disruptor (deps.go, disrupt.go).
//   - discover.go: Inventory, one read of this host's GPUs (not the
//     Kubernetes Node).
//   - core_test.go: the reconcile core on the simulator with a fake clock
//     and fake adapters.
package agent

import (
	"time"

	"github.com/migagent/mig-agent/metrics"
	"github.com/migagent/mig-agent/nvmlx"
)

// Node labels and annotations of the Kubernetes protocol (docs/reference.md#labels-and-annotations-on-the-node).
const (
	// LabelConfig is the desired config name, set by the user.
	LabelConfig = "nvidia.com/mig.config"
	// LabelState is the agent's progress: pending, rebooting, success, failed.
	LabelState = "nvidia.com/mig.config.state"
	// LabelStrategy is the device plugin's MIG strategy, set by GPU Feature Discovery.
	LabelStrategy = "nvidia.com/mig.strategy"
	// AnnotationLastChange holds the newest ChangeRecord as JSON.
	AnnotationLastChange = "migagent.io/last-change"
	// AnnotationHistory holds a JSON array of the newest records, newest first.
	AnnotationHistory = "migagent.io/history"
	// TaintReconfiguring keeps new pods off the node while a change runs.
	TaintReconfiguring = "migagent.io/reconfiguring"
	// LabelManagedBy and LabelNode mark the generated ConfigMap.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelNode      = "migagent.io/node"
	// ConfigMapKey is the key of the generated configs in the ConfigMap.
	ConfigMapKey = "config.yaml"
)

// States of LabelState: the values of migagent_state, defined once in
// metrics.
const (
	StatePending   = metrics.StatePending
	StateRebooting = metrics.StateRebooting
	StateSuccess   = metrics.StateSuccess
	StateFailed    = metrics.StateFailed
)

// History bounds (docs/reference.md#labels-and-annotations-on-the-node).
const (
	HistoryMaxRecords = 16
	HistoryMaxBytes   = 32 << 10
)

// ChangeRecord is one audit record: migagent.io/last-change and each entry
// of migagent.io/history.
type ChangeRecord struct {
	Config         string    `json:"config"`
	PreviousConfig string    `json:"previousConfig"`
	Result         string    `json:"result"` // success, failed, rebooting
	Reason         string    `json:"reason,omitempty"`
	StartedAt      time.Time `json:"startedAt"`
	FinishedAt     time.Time `json:"finishedAt"`
	// DisruptedAt is when the change began to disrupt the node: after it
	// took its rollout slot (--max-concurrent), before the first taint or
	// eviction. Absent for a change that disrupted nothing.
	DisruptedAt   *time.Time `json:"disruptedAt,omitempty"`
	GPUsChanged   []int      `json:"gpusChanged"`
	GPUsUntouched []int      `json:"gpusUntouched"`
	EvictedPods   []string   `json:"evictedPods"`
	Reboot        bool       `json:"reboot"`
	AgentVersion  string     `json:"agentVersion"`
	DriverVersion string     `json:"driverVersion"`
	ConfigHash    string     `json:"configHash"`
	// ConfigSource is "generated", or the config file and its digest:
	// "/etc/mig-agent/config.yaml@sha256:<hex>".
	ConfigSource string `json:"configSource"`
	// RequestedBy is who asked (Requester.By); RequestedVia the field
	// manager of that write, where known; RequestedAt when.
	RequestedBy        string     `json:"requestedBy"`
	RequestedVia       string     `json:"requestedVia,omitempty"`
	RequestedAt        *time.Time `json:"requestedAt,omitempty"`
	ResourcesConverged *bool      `json:"resourcesConverged,omitempty"`
	// AffectedBy says how affected pods were found: "pod-resources", or
	// "all-gpu-pods: <why PodResources could not be read>".
	AffectedBy string `json:"affectedBy,omitempty"`
	// Geometry is the per-GPU geometry after the change ("0": ["3g.71gb@0", ...]).
	Geometry map[string][]string `json:"geometry,omitempty"`
	// GPUsUnusable are the GPUs NVML counts but could not open, left alone.
	GPUsUnusable []nvmlx.UnusableGPU `json:"gpusUnusable,omitempty"`
}

// ConfigSourceGenerated marks a config generated from discovery.
const ConfigSourceGenerated = "generated"
