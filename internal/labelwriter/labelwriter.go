// Package labelwriter tells who last wrote a label of a Kubernetes object,
// from its managedFields: the field manager the API server recorded for the
// write that set the label, and when. The API server keeps an entry per
// field manager (and operation) for every object it created; a write that
// changes the label moves the label to the writer's entry, and a write that
// leaves it as it was moves nothing. The field manager is a name the client
// chose (the fieldManager parameter of the request).
//
// The agent reads it for the record's requestedBy where no admission stamp
// names the user, and to tell a change the planner asked for (its field
// manager) from a person's.
package labelwriter

import (
	"encoding/json"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Of returns the field manager of the newest managedFields entry that owns
// label, and its time (nil where the entry has none); ok is false when no
// entry owns the label. Several entries own a label only where server-side
// apply shares it (two appliers of the same value): the newest one wrote
// last.
func Of(entries []metav1.ManagedFieldsEntry, label string) (manager string, at *time.Time, ok bool) {
	type hit struct {
		manager string
		at      *time.Time
	}
	var hits []hit
	for _, mf := range entries {
		if mf.FieldsV1 == nil || !ownsLabel(mf.FieldsV1.GetRawBytes(), label) {
			continue
		}
		h := hit{manager: mf.Manager}
		if mf.Time != nil {
			t := mf.Time.UTC()
			h.at = &t
		}
		hits = append(hits, h)
	}
	if len(hits) == 0 {
		return "", nil, false
	}
	sort.SliceStable(hits, func(a, b int) bool {
		if hits[a].at == nil || hits[b].at == nil {
			return hits[b].at == nil && hits[a].at != nil
		}
		return hits[a].at.After(*hits[b].at)
	})
	return hits[0].manager, hits[0].at, true
}

// ownsLabel: the fieldsV1 set names label under metadata.labels.
func ownsLabel(raw []byte, label string) bool {
	var set struct {
		Metadata struct {
			Labels map[string]json.RawMessage `json:"f:labels"`
		} `json:"f:metadata"`
	}
	if json.Unmarshal(raw, &set) != nil {
		return false
	}
	_, ok := set.Metadata.Labels["f:"+label]
	return ok
}
