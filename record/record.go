// Package record is the node protocol of mig-agent: the labels and
// annotations it reads and writes on its Node, the states, the Event
// reasons, and the change record (ChangeRecord) with its one codec
// (codec.go: Decode, DecodeHistory, Trail). Everything that reads or
// writes a record goes through here: the agent's writer (package kube),
// its reboot guard (package reconcile), `mig-agent status` and the tests.
//
// It imports the standard library only: it owns the state names and the
// unusable-GPU entry of a record, and the packages that have their own
// (metrics, nvmlx) convert to them.
package record

import (
	"slices"
	"strconv"
	"time"
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
	// AnnotationGPUs, on the same ConfigMap, holds the GPUs as the agent
	// discovered them through NVML (geometry.Published, JSON): what the
	// planner plans the node from. An annotation, so that the ConfigMap's
	// data stays the generated configs alone.
	AnnotationGPUs = "migagent.io/gpus"
)

// A GPU Operator operand paused for a change: its deploy label
// (OperandDeployPrefix + the operand) set to OperandPaused, as NVIDIA's MIG
// manager sets it.
const (
	OperandDeployPrefix = "nvidia.com/gpu.deploy."
	OperandPaused       = "paused-for-mig-change"
)

// States of LabelState, in the order the agent moves through them; also
// the values of the metric migagent_state.
const (
	StatePending   = "pending"
	StateRebooting = "rebooting"
	StateSuccess   = "success"
	StateFailed    = "failed"
)

// The Node condition that mirrors the state label: status True on success,
// False with the reason of the other states, Unknown when no config is
// asked any more (docs/reference.md).
const (
	ConditionConfigReady     = "MIGConfigReady"
	ConditionReasonSuccess   = "Success"
	ConditionReasonPending   = "Pending"
	ConditionReasonRebooting = "Rebooting"
	ConditionReasonFailed    = "Failed"
	// ConditionReasonNotRequested: the desired label was removed; status
	// Unknown, nothing is asked of the GPUs.
	ConditionReasonNotRequested = "NotRequested"
	MaxConditionMessage         = 512
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
	// EvictedPodsOmitted counts the evicted pods beyond MaxRecordPodBytes
	// that EvictedPods does not name (the agent's log and its Events do).
	EvictedPodsOmitted int `json:"evictedPodsOmitted,omitempty"`
	// EvictedPodCount is how many pods the change evicted, named or not.
	EvictedPodCount int `json:"evictedPodCount,omitempty"`
	// FullRecord says where the whole record is when this one, on the
	// Node, leaves something out (FullRecordRef): the pods it does not
	// name, the geometry, a reason cut short.
	FullRecord    string `json:"fullRecord,omitempty"`
	Reboot        bool   `json:"reboot"`
	AgentVersion  string `json:"agentVersion"`
	DriverVersion string `json:"driverVersion"`
	ConfigHash    string `json:"configHash"`
	// PreviousConfigHash is the configHash applied before the change; with
	// config equal to previousConfig, it tells a changed definition of the
	// same config (a new request) apart.
	PreviousConfigHash string `json:"previousConfigHash,omitempty"`
	// ConfigSource is "generated", or the config file and its digest:
	// "/etc/mig-agent/config.yaml@sha256:<hex>".
	ConfigSource string `json:"configSource"`
	// RequestedBy is who asked (Requester.By); RequestedVia the field
	// manager of that write, where known; RequestedAt when.
	RequestedBy  string `json:"requestedBy"`
	RequestedVia string `json:"requestedVia,omitempty"`
	// RequestedBySource says where RequestedBy comes from: one of the
	// RequesterSource values (stamp, managedFields, default-config,
	// standalone, unknown).
	RequestedBySource  string     `json:"requestedBySource,omitempty"`
	RequestedAt        *time.Time `json:"requestedAt,omitempty"`
	ResourcesConverged *bool      `json:"resourcesConverged,omitempty"`
	// AffectedBy says how affected pods were found: "pod-resources", or
	// "all-gpu-pods: <why PodResources could not be read>".
	AffectedBy string `json:"affectedBy,omitempty"`
	// ServedBy is the allocation path that hands the node's GPUs to pods:
	// ServedByDevicePlugin or ServedByDRA ("" standalone, or none seen).
	ServedBy string `json:"servedBy,omitempty"`
	// Geometry is the per-GPU geometry after the change ("0": ["3g.71gb@0", ...]).
	Geometry map[string][]string `json:"geometry,omitempty"`
	// GPUsUnusable are the GPUs NVML counts but could not open, left alone.
	GPUsUnusable []UnusableGPU `json:"gpusUnusable,omitempty"`
}

// UnusableGPU is an entry of gpusUnusable: a GPU NVML counts but the agent
// cannot read, left alone.
type UnusableGPU struct {
	Index int `json:"index"`
	// Return is NVML's return code name ("ERROR_NO_PERMISSION"), or
	// "ERROR_UNKNOWN" for a failure that is not NVML's.
	Return string `json:"error"`
	// Reason is the whole error: which call failed.
	Reason string `json:"reason"`
}

// Event reasons (stable; documented in docs/observability.md).
const (
	ReasonStarted          = "MigConfigStarted"
	ReasonApplied          = "MigConfigApplied"
	ReasonUnchanged        = "MigConfigUnchanged"
	ReasonFailed           = "MigConfigFailed"
	ReasonInvalid          = "MigConfigInvalid"
	ReasonEvicting         = "MigEvictingPods"
	ReasonRebooting        = "MigRebooting"
	ReasonRebootFailed     = "MigRebootFailed"
	ReasonDrift            = "MigGeometryDrift"
	ReasonResourcesTimeout = "MigResourcesTimeout"
	ReasonManagerConflict  = "MigManagerConflict"
	// ReasonAbandoned: a change stopped unfinished, its label changed or
	// removed (Normal).
	ReasonAbandoned = "MigConfigAbandoned"
	// ReasonAllocationPathConflict: the node's GPUs are served by both the
	// device plugin and the NVIDIA DRA driver (Warning, change refused).
	ReasonAllocationPathConflict = "MigAllocationPathConflict"
	// ReasonGPUUnusable: a GPU NVML counts but cannot open (Warning,
	// posted when the set of such GPUs changes).
	ReasonGPUUnusable = "MigGPUUnusable"
	// ReasonDevicePluginRestarted: the device plugin pods that read the old
	// geometry were restarted after a change.
	ReasonDevicePluginRestarted = "MigDevicePluginRestarted"
	ReasonJournal               = "MigJournalUnwritable"
	// ReasonSlotLost: the rollout slot (--max-concurrent) was lost
	// mid-change; the change stopped before its next disruptive step.
	ReasonSlotLost = "MigRolloutSlotLost"
	// ReasonNodeLost: another agent holds the node (its node Lease); the
	// change stopped before its next GPU-mutating step.
	ReasonNodeLost = "MigNodeLeaseLost"
)

// ReasonPreflight is the Event reason of a change refused because the agent
// may not write what the change must write.
const ReasonPreflight = "MigPreflightFailed"

// ReasonStartupTaintsRemoved is the Event reason of the startup taints
// (--startup-taint) removed from a node whose geometry has converged.
const ReasonStartupTaintsRemoved = "MigStartupTaintsRemoved"

// ReasonRecordRetired is the Event reason of a record that the history
// bound dropped from migagent.io/history.
const ReasonRecordRetired = "MigRecordRetired"

const (
	// AnnotationHistoryUnparsable keeps a migagent.io/history value that was
	// not a JSON array of records when the next record was written.
	AnnotationHistoryUnparsable = "migagent.io/history-unparsable"
	// MaxRecordReason bounds the reason of a record, in bytes.
	MaxRecordReason = 1024
	// ReasonRecordFailed is the Event reason of a record the API server refused.
	ReasonRecordFailed = "MigRecordFailed"
	// ReasonHistoryUnparsable is the Event reason of a history kept aside.
	ReasonHistoryUnparsable = "MigHistoryUnparsable"
	// ReasonHistoryUnwritable is the Event reason of a record that the
	// history ConfigMap refused: the Node keeps it whole.
	ReasonHistoryUnwritable = "MigHistoryUnwritable"
)

const (
	// AnnotationRequestedBy is the requester stamp: a JSON RequesterStamp.
	AnnotationRequestedBy = "migagent.io/requested-by"
	// PlannerFieldManager is the field manager of every write of `mig-agent
	// planner`: the agent knows a change the planner asked for by it (the
	// managedFields entry that owns the desired label, or the requester
	// stamp's via), and refuses such a change, rather than evict, when it
	// would take a device in use.
	PlannerFieldManager = "mig-agent-planner"
	// LabelPlannerOptIn = PlannerOptInValue on a Node lets the planner
	// change its desired config; the agent applies a change the planner
	// asked for only on such a node.
	LabelPlannerOptIn = "migagent.io/planner"
	PlannerOptInValue = "enabled"
	// RequesterUnknown is requestedBy when neither the stamp nor
	// managedFields name who set the label.
	RequesterUnknown = "unknown"
	// RequesterDefaultConfig is requestedBy of a change to --default-config.
	RequesterDefaultConfig = "default-config"
	// RequesterStandalone is requestedBy in standalone mode.
	RequesterStandalone = "standalone"
)

// RequesterStamp is the value of AnnotationRequestedBy, as the admission
// policy mig-agent-requester writes it on every write that sets the desired
// label to a new value.
type RequesterStamp struct {
	// User is request.userInfo.username of the write.
	User string `json:"user"`
	// Via is the write's fieldManager parameter ("" when it sent none).
	Via string `json:"via"`
	// Config is the value of the desired label that the write set.
	Config string `json:"config"`
}

// Where a record's requestedBy comes from (requestedBySource).
const (
	// RequesterSourceStamp: the user the API server authenticated, from the
	// requester stamp that the admission policy wrote.
	RequesterSourceStamp = "stamp"
	// RequesterSourceManagedFields: the field manager of the write in the
	// Node's managedFields, a name the client chose (no stamp policy).
	RequesterSourceManagedFields = "managedFields"
	// RequesterSourceDefaultConfig: the agent's --default-config.
	RequesterSourceDefaultConfig = "default-config"
	// RequesterSourceStandalone: standalone mode, no Kubernetes.
	RequesterSourceStandalone = "standalone"
	// RequesterSourceUnknown: nothing names who asked, or a stamp that does
	// not parse (never replaced by a client-chosen name).
	RequesterSourceUnknown = "unknown"
)

// Bounds of a record's fields: whatever a user name, a pod list or an
// error says, one record stays within MaxRecordBytes, so it always lands
// and never pushes more than its share out of the history.
const (
	// MaxRequester bounds requestedBy and requestedVia, in bytes; a longer
	// name keeps its start and is marked (TruncatedMark).
	MaxRequester = 256
	// MaxRecordPodBytes is how much of a record the names of its evicted
	// pods may take (their JSON, in bytes): the pods that do not fit are
	// counted in evictedPodsOmitted. Pods of a usual length all fit on a
	// node of 8 GPUs split in 7 (56 pods); worst-case names, 16.
	MaxRecordPodBytes = 5 << 10
	// MaxRecordPod bounds one evicted pod's "namespace/name" (63 + 1 + 253
	// bytes in Kubernetes), in bytes.
	MaxRecordPod = 317
	// MaxRecordField bounds the other free-text fields (configSource,
	// affectedBy, versions), in bytes.
	MaxRecordField = 256
	// MaxRecordUnusable bounds an unusable GPU's reason in a record, in
	// bytes (the whole error is in the agent's log and its Event).
	MaxRecordUnusable = 128
	// MaxRecordBytes is the most a bounded record encodes to.
	MaxRecordBytes = 14 << 10
)

// TruncatedMark ends a requester name, or another field, cut to its bound:
// " …[N bytes in all]".
const TruncatedMark = " …["

// Bounded returns r with every field within its bound (see MaxRequester
// and the others): a cut text keeps its start and is marked with its whole
// length; the evicted pods beyond MaxRecordPods are counted, not named.
func (r ChangeRecord) Bounded() ChangeRecord {
	r.Reason = CapReason(r.Reason)
	r.RequestedBy = BoundText(r.RequestedBy, MaxRequester)
	r.RequestedVia = BoundText(r.RequestedVia, MaxRequester)
	r.Config = BoundText(r.Config, MaxRecordField)
	r.PreviousConfig = BoundText(r.PreviousConfig, MaxRecordField)
	r.ConfigSource = BoundText(r.ConfigSource, MaxRecordField)
	r.ConfigHash = BoundText(r.ConfigHash, MaxRecordField)
	r.AffectedBy = BoundText(r.AffectedBy, MaxRecordField)
	r.AgentVersion = BoundText(r.AgentVersion, MaxRecordField)
	r.DriverVersion = BoundText(r.DriverVersion, MaxRecordField)
	r.RequestedBySource = BoundText(r.RequestedBySource, MaxRecordField)
	if r.EvictedPods != nil {
		if r.EvictedPodCount == 0 {
			r.EvictedPodCount = len(r.EvictedPods) + r.EvictedPodsOmitted
		}
		var cut int
		r.EvictedPods, cut = capPods(r.EvictedPods, MaxRecordPodBytes)
		r.EvictedPodsOmitted += cut
	}
	if len(r.GPUsUnusable) > 0 {
		u := slices.Clone(r.GPUsUnusable)
		for i := range u {
			u[i].Reason = BoundText(u[i].Reason, MaxRecordUnusable)
			u[i].Return = BoundText(u[i].Return, MaxRecordField)
		}
		r.GPUsUnusable = u
	}
	return r
}

// RequestedByText names who asked and how the agent knows, for Events:
// `requested by "alice" via "kubectl-label" (stamp)`; each name within
// MaxRequester.
func RequestedByText(by, via, source string) string {
	s := "requested by " + strconv.Quote(BoundText(by, MaxRequester))
	if via != "" && via != by {
		s += " via " + strconv.Quote(BoundText(via, MaxRequester))
	}
	if source == "" {
		source = RequesterSourceUnknown
	}
	return s + " (" + source + ")"
}

// MaxDisrupted is the largest number of records whose disruption
// intervals, [disruptedAt, finishedAt], overlap at one instant: how many
// nodes were ever between taking a rollout slot and the end of their change
// at once (the --max-concurrent bound). Records without disruptedAt (no slot
// taken) do not count. An end and a start at the same instant do not
// overlap.
func MaxDisrupted(recs []ChangeRecord) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, r := range recs {
		if r.DisruptedAt != nil {
			edges = append(edges, edge{*r.DisruptedAt, +1}, edge{r.FinishedAt, -1})
		}
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // the end first
	})
	cur, most := 0, 0
	for _, e := range edges {
		cur += e.delta
		most = max(most, cur)
	}
	return most
}

// Values of ChangeRecord.ServedBy: the path that hands the GPUs to pods.
const (
	// ServedByDevicePlugin: NVIDIA's device plugin (nvidia.com/ resources
	// in the Node's allocatable).
	ServedByDevicePlugin = "device-plugin"
	// ServedByDRA: NVIDIA's DRA driver (gpu.nvidia.com ResourceSlices).
	ServedByDRA = "dra"
)

// Values of ChangeRecord.AffectedBy: how the affected pods were found.
const (
	// AffectedByPodResources: from the kubelet PodResources API.
	AffectedByPodResources = "pod-resources"
	// AffectedByAllGPUPodsPrefix starts AffectedBy when PodResources could
	// not be read and every GPU pod of the node was taken as affected; the
	// reason follows.
	AffectedByAllGPUPodsPrefix = "all-gpu-pods: "
	// AffectedByNothing: the change takes no device away, so no pod is
	// affected.
	AffectedByNothing = "none"
)

// AnnotationBudget is Kubernetes' bound on all the annotations of one
// object together, keys and values counted in bytes: apimachinery's
// TotalAnnotationSizeLimitB (256 KiB), checked by ValidateAnnotations
// (pkg/api/validation/objectmeta.go, ValidateAnnotationsSize) on every
// write of a Node. The agent's records share it with every other writer of
// the Node's annotations.
const AnnotationBudget = 256 << 10

// RecordAnnotations are the annotations a record write sets (Record,
// RecordRetiring in package kube): the last change, the history, and the
// history kept aside when it did not parse.
var RecordAnnotations = []string{AnnotationLastChange, AnnotationHistory, AnnotationHistoryUnparsable}

// RecordBudget says whether a record at its bounds lands on a Node whose
// annotations are these: the annotations that are not the agent's records
// as they are, the last change at MaxRecordBytes, the history at
// HistoryMaxBytes, and the history kept aside at HistoryMaxBytes when there
// is one or when the history does not parse (then the next record sets it
// aside). It returns the bytes the Node's annotations may take with such a
// record (need, within AnnotationBudget when it fits) and those the other
// writers' annotations take (others), as Kubernetes counts them.
func RecordBudget(annotations map[string]string) (need, others int, fits bool) {
	for k, v := range annotations {
		if !slices.Contains(RecordAnnotations, k) {
			others += len(k) + len(v)
		}
	}
	need = others + len(AnnotationLastChange) + MaxRecordBytes + len(AnnotationHistory) + HistoryMaxBytes
	if _, err := SplitHistory(annotations[AnnotationHistory]); err != nil {
		need += len(AnnotationHistoryUnparsable) + HistoryMaxBytes // set aside, cut to HistoryMaxBytes
	} else if aside, ok := annotations[AnnotationHistoryUnparsable]; ok {
		need += len(AnnotationHistoryUnparsable) + len(aside) // kept as it is
	}
	return need, others, need <= AnnotationBudget
}
