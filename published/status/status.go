// Package status is the view of one node that `mig-agent status` shows: read
// from the Node's labels and annotations (and, where the agent keeps them,
// the whole records of its history ConfigMap), with or without the agent
// running; as JSON (Status, whose field names are part of the command's
// contract) or as text for a person (WriteText). It reads what the agent
// publishes through package published and, like it, links neither the
// agent's core nor NVML.
package status

import (
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/record"
)

// ErrNoNode is returned by FromNode for a nil Node.
var ErrNoNode = errors.New("no node")

// Status is what `mig-agent status` shows about one node: read from the
// Node's labels and audit annotations only, so it works from any machine
// with read access to the Node, with or without the agent running.
type Status struct {
	// Node is the Node's name.
	Node string `json:"node"`
	// Desired is the label nvidia.com/mig.config; empty when unset.
	Desired string `json:"desired"`
	// Applied is the config of the newest change record with result
	// success (last-change first, then the history); nil when none.
	Applied *AppliedConfig `json:"applied,omitempty"`
	// State is the label nvidia.com/mig.config.state; empty when unset.
	State string `json:"state"`
	// Strategy is the label nvidia.com/mig.strategy; empty when unset.
	Strategy string `json:"strategy,omitempty"`
	// Requester is who asked for Desired, as the agent would record it (the
	// requester stamp, else managedFields); nil when Desired is unset.
	Requester *Requester `json:"requester,omitempty"`
	// GPUs is the per-GPU geometry of the last-change record, or of the
	// newest history record that has one when the last change has none
	// (see GeometryAt and Notes). Sorted by index.
	GPUs []record.GPUGeometry `json:"gpus"`
	// GeometryAt is the finishedAt of the record GPUs come from.
	GeometryAt *time.Time `json:"geometryAt,omitempty"`
	// LastChange is the annotation migagent.io/last-change; nil when
	// missing or not a valid record.
	LastChange *record.ChangeRecord `json:"lastChange,omitempty"`
	// History is the annotation migagent.io/history, newest first, without
	// the entries that are not valid records; or, where the history
	// ConfigMap holds them (HistoryFrom), the same records whole.
	History []record.ChangeRecord `json:"history"`
	// HistoryFrom names where History and LastChange were read whole:
	// "ConfigMap <namespace>/<node>-mig-history"; empty: the Node.
	HistoryFrom string `json:"historyFrom,omitempty"`
	// Notes says what could not be read and why, for a person.
	Notes []string `json:"notes,omitempty"`
}

// Requester is who set the desired label, and how that is known.
type Requester struct {
	// By, Via and At as in published.Requester (At: managedFields only).
	By  string     `json:"by"`
	Via string     `json:"via,omitempty"`
	At  *time.Time `json:"at,omitempty"`
	// Source is "stamp" (the user the API server authenticated),
	// "managedFields" (a field manager: a name the client chose) or
	// "unknown" (nothing names who asked, or a stamp that does not parse).
	Source string `json:"source,omitempty"`
}

// AppliedConfig is the config of the newest successful change.
type AppliedConfig struct {
	Config string `json:"config"`
	// Hash is the record's configHash (sha256 of the applied geometry).
	Hash string `json:"hash,omitempty"`
	// Source is the record's configSource.
	Source string `json:"source,omitempty"`
	// At is the record's finishedAt.
	At time.Time `json:"at"`
}

// FromNode reads the status of node from its labels and annotations.
// Missing or malformed annotations are not an error: Status holds what could
// be read and a note for each problem. The only error is ErrNoNode.
func FromNode(node *corev1.Node) (*Status, error) {
	return WithHistory(node, nil, "")
}

// WithHistory is FromNode with the history read whole from
// the history ConfigMap (whole, newest first, as published.ReadHistory returns it;
// from names it): the Node's light records are replaced by their whole
// form, the last change too when it is the ConfigMap's newest. A nil
// whole reads the Node alone.
func WithHistory(node *corev1.Node, whole []record.ChangeRecord, from string) (*Status, error) {
	if node == nil {
		return nil, ErrNoNode
	}
	labels, ann := node.Labels, node.Annotations
	s := &Status{
		Node:     node.Name,
		Desired:  labels[record.LabelConfig],
		State:    labels[record.LabelState],
		Strategy: labels[record.LabelStrategy],
		GPUs:     []record.GPUGeometry{},
		History:  []record.ChangeRecord{},
	}
	if s.Desired == "" {
		s.note("label %s is not set: the agent applies its --default-config, if it has one", record.LabelConfig)
	}
	if s.State == "" {
		s.note("label %s is not set: the agent has not acted on this node yet", record.LabelState)
	}
	if _, ok := labels[record.LabelConfig]; ok {
		r := published.RequesterOf(node, s.Desired)
		s.Requester = &Requester{By: r.By, Via: r.Via, At: r.At, Source: r.Source}
		if r.Ignored != "" {
			s.note("annotation %s is not used: %s", record.AnnotationRequestedBy, r.Ignored)
		}
	}

	if raw, ok := ann[record.AnnotationLastChange]; !ok {
		s.note("annotation %s is missing: no change recorded yet", record.AnnotationLastChange)
	} else if rec, err := record.Decode([]byte(raw)); err != nil {
		s.note("annotation %s is not a valid change record: %v", record.AnnotationLastChange, err)
	} else {
		s.LastChange = &rec
	}

	if raw, ok := ann[record.AnnotationHistory]; !ok {
		s.note("annotation %s is missing", record.AnnotationHistory)
	} else {
		recs, bad, err := record.DecodeHistory(raw)
		if err != nil {
			s.note("annotation %s is not a JSON array: %v", record.AnnotationHistory, err)
		}
		for _, b := range bad {
			s.note("annotation %s: entry %d is not a valid change record: %v", record.AnnotationHistory, b.Index, b.Err)
		}
		s.History = append(s.History, recs...)
	}

	if whole != nil {
		s.History, s.HistoryFrom = whole, from
		if l := s.LastChange; l != nil && len(whole) > 0 && sameRecord(*l, whole[0]) {
			s.LastChange = &whole[0]
		}
	}
	// Newest first: the last change, then the history.
	records := s.History
	if s.LastChange != nil {
		records = append([]record.ChangeRecord{*s.LastChange}, s.History...)
	}
	if r := record.Applied(records); r != nil {
		s.Applied = &AppliedConfig{Config: r.Config, Hash: r.ConfigHash, Source: r.ConfigSource, At: r.FinishedAt}
	}
	if i := record.WithGeometry(records); i >= 0 {
		r := records[i]
		switch {
		case s.LastChange == nil:
			s.note("GPU geometry is from the history record finished %s: there is no valid last-change record", r.FinishedAt.UTC().Format(time.RFC3339))
		case i > 0:
			s.note("GPU geometry is from the change finished %s: the last change recorded none", r.FinishedAt.UTC().Format(time.RFC3339))
		}
		at := r.FinishedAt
		s.GeometryAt = &at
		var bad []string
		s.GPUs, bad = record.GeometryRows(r.Geometry)
		for _, key := range bad {
			s.note("GPU geometry: %q is not a GPU index, skipped", key)
		}
	}
	return s, nil
}

// sameRecord says whether a and b are one record, one of them in its light
// form: the same published.RecordKey.
func sameRecord(a, b record.ChangeRecord) bool {
	return published.RecordKey(a) == published.RecordKey(b)
}

func (s *Status) note(format string, args ...any) {
	s.Notes = append(s.Notes, fmt.Sprintf(format, args...))
}
