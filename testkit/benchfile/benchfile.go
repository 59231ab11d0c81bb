// Package benchfile writes the benches' figures into one results file
// (bench-results.json): each bench owns its keys of the JSON object and
// keeps every other key as it finds it.
package benchfile

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Merge writes the keys of sections into the JSON object in path, keeping
// every other key. A file that is not a JSON object is an error, not
// overwritten.
func Merge(path string, sections map[string]json.RawMessage) error {
	doc := map[string]json.RawMessage{}
	if raw, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(raw, &doc); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	} else if !os.IsNotExist(err) {
		return err
	}
	for k, v := range sections {
		doc[k] = v
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(out, '\n'), 0o644)
}

// MergeKey writes v under key.
func MergeKey(path, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return Merge(path, map[string]json.RawMessage{key: data})
}

// LoadAvg is the machine's 1-minute load average (/proc/loadavg; 0 when
// unreadable), which each bench reports beside its figures.
func LoadAvg() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
