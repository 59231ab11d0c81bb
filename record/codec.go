package record

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The one codec of the records on a Node: the last-change annotation, the
// history annotation, and the rules both follow. Everything that reads or
// writes them (the agent's writer, its reboot guard, `mig-agent status`,
// the tests) goes through here.

// Decode decodes one change record and checks that it has the fields every
// record has (config, result).
func Decode(b []byte) (ChangeRecord, error) {
	var r ChangeRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return ChangeRecord{}, err
	}
	var missing []string
	if r.Config == "" {
		missing = append(missing, "config")
	}
	if r.Result == "" {
		missing = append(missing, "result")
	}
	if len(missing) > 0 {
		return ChangeRecord{}, fmt.Errorf("no %s", strings.Join(missing, ", no "))
	}
	return r, nil
}

// SplitHistory splits the history annotation into its entries, newest
// first, undecoded; an error when it is not a JSON array. "" is no history.
func SplitHistory(raw string) ([]json.RawMessage, error) {
	if raw == "" {
		return nil, nil
	}
	var entries []json.RawMessage
	if err := json.Unmarshal([]byte(raw), &entries); err != nil {
		return nil, err
	}
	return entries, nil
}

// BadEntry is a history entry that is not a valid record.
type BadEntry struct {
	Index int
	Err   error
}

// DecodeHistory decodes the history annotation, newest first: the entries
// that are valid records, and those that are not; err when the annotation
// is not a JSON array (then there are no records).
func DecodeHistory(raw string) (recs []ChangeRecord, bad []BadEntry, err error) {
	entries, err := SplitHistory(raw)
	if err != nil {
		return nil, nil, err
	}
	for i, e := range entries {
		r, err := Decode(e)
		if err != nil {
			bad = append(bad, BadEntry{Index: i, Err: err})
			continue
		}
		recs = append(recs, r)
	}
	return recs, bad, nil
}

// Trail is a Node's records, newest first: the history, or the last change
// alone when the history does not decode (annotations as on the Node).
func Trail(annotations map[string]string) []ChangeRecord {
	if recs, _, err := DecodeHistory(annotations[AnnotationHistory]); err == nil && len(recs) > 0 {
		return recs
	}
	if r, err := Decode([]byte(annotations[AnnotationLastChange])); err == nil {
		return []ChangeRecord{r}
	}
	return nil
}
