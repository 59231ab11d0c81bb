package record

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"
)

// What a node's records say of it, for whoever reads them (`mig-agent
// status`, the planner): one derivation, whatever the reader.

// NodeRecords are the valid records of a Node's annotations, newest first:
// the last change, then the history (its entries that decode).
func NodeRecords(annotations map[string]string) []ChangeRecord {
	var out []ChangeRecord
	if rec, err := Decode([]byte(annotations[AnnotationLastChange])); err == nil {
		out = append(out, rec)
	}
	if raw, ok := annotations[AnnotationHistory]; ok {
		recs, _, _ := DecodeHistory(raw)
		out = append(out, recs...)
	}
	return out
}

// Applied is the newest record of recs (newest first) with result success:
// the config the node runs; nil when none.
func Applied(recs []ChangeRecord) *ChangeRecord {
	for i := range recs {
		if recs[i].Result == StateSuccess {
			return &recs[i]
		}
	}
	return nil
}

// WithGeometry is the index of the newest record of recs (newest first)
// that holds a geometry; -1 when none does.
func WithGeometry(recs []ChangeRecord) int {
	return slices.IndexFunc(recs, func(r ChangeRecord) bool { return r.Geometry != nil })
}

// GPUGeometry is the geometry of one GPU as a change record holds it.
type GPUGeometry struct {
	Index int `json:"index"`
	// Instances are "profile@start", sorted by start.
	Instances []string `json:"instances"`
	// Profiles counts instances per profile.
	Profiles map[string]int `json:"profiles"`
}

// GeometryRows turns a record's Geometry map into rows sorted by GPU
// index; bad are its keys that are no GPU index, sorted.
func GeometryRows(g map[string][]string) (rows []GPUGeometry, bad []string) {
	rows = []GPUGeometry{}
	for key, instances := range g {
		idx, err := strconv.Atoi(key)
		if err != nil || idx < 0 {
			bad = append(bad, key)
			continue
		}
		inst := slices.Clone(instances)
		if inst == nil {
			inst = []string{}
		}
		slices.SortStableFunc(inst, func(a, b string) int {
			_, sa := SplitInstance(a)
			_, sb := SplitInstance(b)
			return cmp.Or(cmp.Compare(sa, sb), cmp.Compare(a, b))
		})
		profiles := map[string]int{}
		for _, in := range inst {
			p, _ := SplitInstance(in)
			profiles[p]++
		}
		rows = append(rows, GPUGeometry{Index: idx, Instances: inst, Profiles: profiles})
	}
	slices.SortFunc(rows, func(a, b GPUGeometry) int { return cmp.Compare(a.Index, b.Index) })
	slices.Sort(bad)
	return rows, bad
}

// SplitInstance splits "3g.71gb@4" into the profile and the start; an entry
// without a valid start sorts last.
func SplitInstance(in string) (profile string, start int) {
	i := strings.LastIndexByte(in, '@')
	if i < 0 {
		return in, math.MaxInt
	}
	n, err := strconv.Atoi(in[i+1:])
	if err != nil {
		return in[:i], math.MaxInt
	}
	return in[:i], n
}
