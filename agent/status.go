package agent

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"
)

// ErrNoNode is returned by StatusFromNode for a nil Node.
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
	Requester *StatusRequester `json:"requester,omitempty"`
	// GPUs is the per-GPU geometry of the last-change record, or of the
	// newest history record that has one when the last change has none
	// (see GeometryAt and Notes). Sorted by index.
	GPUs []GPUGeometry `json:"gpus"`
	// GeometryAt is the finishedAt of the record GPUs come from.
	GeometryAt *time.Time `json:"geometryAt,omitempty"`
	// LastChange is the annotation migagent.io/last-change; nil when
	// missing or not a valid record.
	LastChange *ChangeRecord `json:"lastChange,omitempty"`
	// History is the annotation migagent.io/history, newest first, without
	// the entries that are not valid records.
	History []ChangeRecord `json:"history"`
	// Notes says what could not be read and why, for a person.
	Notes []string `json:"notes,omitempty"`
}

// StatusRequester is who set the desired label, and how that is known.
type StatusRequester struct {
	// By, Via and At as in Requester (At: managedFields only).
	By  string     `json:"by"`
	Via string     `json:"via,omitempty"`
	At  *time.Time `json:"at,omitempty"`
	// Source is "admission" (the user the API server authenticated),
	// "managed-fields" (a field manager: a name the client chose) or ""
	// (unknown).
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

// GPUGeometry is the geometry of one GPU as a change record holds it.
type GPUGeometry struct {
	Index int `json:"index"`
	// Instances are "profile@start", sorted by start.
	Instances []string `json:"instances"`
	// Profiles counts instances per profile.
	Profiles map[string]int `json:"profiles"`
}

// StatusFromNode reads the status of node from its labels and annotations.
// Missing or malformed annotations are not an error: Status holds what could
// be read and a note for each problem. The only error is ErrNoNode.
func StatusFromNode(node *corev1.Node) (*Status, error) {
	if node == nil {
		return nil, ErrNoNode
	}
	labels, ann := node.Labels, node.Annotations
	s := &Status{
		Node:     node.Name,
		Desired:  labels[LabelConfig],
		State:    labels[LabelState],
		Strategy: labels[LabelStrategy],
		GPUs:     []GPUGeometry{},
		History:  []ChangeRecord{},
	}
	if s.Desired == "" {
		s.note("label %s is not set: the agent applies its --default-config, if it has one", LabelConfig)
	}
	if s.State == "" {
		s.note("label %s is not set: the agent has not acted on this node yet", LabelState)
	}
	if _, ok := labels[LabelConfig]; ok {
		r := RequesterOf(node, s.Desired)
		s.Requester = &StatusRequester{By: r.By, Via: r.Via, At: r.At, Source: r.Source}
		if r.Ignored != "" {
			s.note("annotation %s is not used: %s", AnnotationRequestedBy, r.Ignored)
		}
	}

	if raw, ok := ann[AnnotationLastChange]; !ok {
		s.note("annotation %s is missing: no change recorded yet", AnnotationLastChange)
	} else if rec, err := parseRecord([]byte(raw)); err != nil {
		s.note("annotation %s is not a valid change record: %v", AnnotationLastChange, err)
	} else {
		s.LastChange = &rec
	}

	if raw, ok := ann[AnnotationHistory]; !ok {
		s.note("annotation %s is missing", AnnotationHistory)
	} else {
		var entries []json.RawMessage
		if err := json.Unmarshal([]byte(raw), &entries); err != nil {
			s.note("annotation %s is not a JSON array: %v", AnnotationHistory, err)
		}
		for i, e := range entries {
			rec, err := parseRecord(e)
			if err != nil {
				s.note("annotation %s: entry %d is not a valid change record: %v", AnnotationHistory, i, err)
				continue
			}
			s.History = append(s.History, rec)
		}
	}

	// Newest first: the last change, then the history.
	records := s.History
	if s.LastChange != nil {
		records = append([]ChangeRecord{*s.LastChange}, s.History...)
	}
	for _, r := range records {
		if r.Result == StateSuccess {
			s.Applied = &AppliedConfig{Config: r.Config, Hash: r.ConfigHash, Source: r.ConfigSource, At: r.FinishedAt}
			break
		}
	}
	for i, r := range records {
		if r.Geometry == nil {
			continue
		}
		switch {
		case s.LastChange == nil:
			s.note("GPU geometry is from the history record finished %s: there is no valid last-change record", formatTime(r.FinishedAt))
		case i > 0:
			s.note("GPU geometry is from the change finished %s: the last change recorded none", formatTime(r.FinishedAt))
		}
		at := r.FinishedAt
		s.GeometryAt = &at
		s.GPUs = s.geometry(r.Geometry)
		break
	}
	return s, nil
}

// parseRecord decodes one change record and checks that it has the fields
// every record has.
func parseRecord(b []byte) (ChangeRecord, error) {
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

// geometry turns a record's Geometry map into rows sorted by GPU index.
func (s *Status) geometry(g map[string][]string) []GPUGeometry {
	out := []GPUGeometry{}
	var bad []string
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
			_, sa := splitInstance(a)
			_, sb := splitInstance(b)
			return cmp.Or(cmp.Compare(sa, sb), cmp.Compare(a, b))
		})
		profiles := map[string]int{}
		for _, in := range inst {
			p, _ := splitInstance(in)
			profiles[p]++
		}
		out = append(out, GPUGeometry{Index: idx, Instances: inst, Profiles: profiles})
	}
	slices.SortFunc(out, func(a, b GPUGeometry) int { return cmp.Compare(a.Index, b.Index) })
	slices.Sort(bad)
	for _, key := range bad {
		s.note("GPU geometry: %q is not a GPU index, skipped", key)
	}
	return out
}

// splitInstance splits "3g.71gb@4" into the profile and the start; an entry
// without a valid start sorts last.
func splitInstance(in string) (profile string, start int) {
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

func (s *Status) note(format string, args ...any) {
	s.Notes = append(s.Notes, fmt.Sprintf(format, args...))
}

// WriteText writes the status for a person: the configs and state, the
// per-GPU geometry, the last change in full and the history as a table.
// Text from the annotations is printed with control characters replaced.
func (s *Status) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	p := func(format string, args ...any) { fmt.Fprintf(ew, format, args...) }

	p("Node:      %s\n", clean(s.Node))
	p("Desired:   %s\n", orDash(s.Desired))
	p("State:     %s\n", orDash(s.State))
	if a := s.Applied; a != nil {
		extra := []string{"at " + formatTime(a.At)}
		if a.Hash != "" {
			extra = append(extra, "hash "+shortDigests(clean(a.Hash)))
		}
		if a.Source != "" {
			extra = append(extra, "from "+shortDigests(clean(a.Source)))
		}
		p("Applied:   %s (%s)\n", clean(a.Config), strings.Join(extra, ", "))
	} else {
		p("Applied:   - (no successful change recorded)\n")
	}
	if s.Strategy != "" {
		p("Strategy:  %s\n", clean(s.Strategy))
	}
	if r := s.Requester; r != nil {
		how := map[string]string{
			RequesterFromAdmission:     "authenticated by the API server",
			RequesterFromManagedFields: "field manager from managedFields, a name the client chose",
		}[r.Source]
		if how == "" {
			how = "neither the requester stamp nor managedFields name who set the label"
		}
		at := ""
		if r.At != nil {
			at = " at " + formatTime(*r.At)
		}
		p("Requested: %s%s (%s)\n", requester(r.By, r.Via), at, how)
	}

	p("\nGPU geometry")
	if s.GeometryAt != nil {
		p(" (after the change finished %s)", formatTime(*s.GeometryAt))
	}
	p(":\n")
	if len(s.GPUs) == 0 {
		p("  none recorded\n")
	} else {
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  GPU\tPROFILES\tINSTANCES (profile@start)\n")
		for _, g := range s.GPUs {
			fmt.Fprintf(tw, "  %d\t%s\t%s\n", g.Index, profileSummary(g), orDash(strings.Join(g.Instances, " ")))
		}
		_ = tw.Flush()
	}

	p("\nLast change:\n")
	if r := s.LastChange; r == nil {
		p("  none recorded\n")
	} else {
		tw := tabwriter.NewWriter(ew, 0, 0, 1, ' ', 0)
		row := func(k, v string) { fmt.Fprintf(tw, "  %s:\t%s\n", k, v) }
		cfg := clean(r.Config)
		if r.PreviousConfig != "" {
			cfg += " (previous " + clean(r.PreviousConfig) + ")"
		}
		row("Config", cfg)
		row("Result", clean(r.Result))
		if r.Reason != "" {
			row("Reason", clean(r.Reason))
		}
		row("Started", formatTime(r.StartedAt))
		fin := formatTime(r.FinishedAt)
		if !r.StartedAt.IsZero() && !r.FinishedAt.IsZero() {
			fin += " (took " + formatDuration(r.FinishedAt.Sub(r.StartedAt)) + ")"
		}
		row("Finished", fin)
		row("GPUs changed", formatInts(r.GPUsChanged))
		row("GPUs untouched", formatInts(r.GPUsUntouched))
		row("Evicted pods", orDash(strings.Join(r.EvictedPods, ", ")))
		if r.AffectedBy != "" {
			row("Pods found by", clean(r.AffectedBy))
		}
		row("Reboot", yesNo(r.Reboot))
		if r.ResourcesConverged != nil {
			row("Resources advertised", yesNo(*r.ResourcesConverged))
		}
		req := requester(r.RequestedBy, r.RequestedVia)
		if r.RequestedAt != nil {
			req += " at " + formatTime(*r.RequestedAt)
		}
		row("Requested by", req)
		row("Config source", orDash(r.ConfigSource))
		row("Config hash", orDash(r.ConfigHash))
		row("Agent version", orDash(r.AgentVersion))
		row("Driver version", orDash(r.DriverVersion))
		_ = tw.Flush()
	}

	p("\nHistory (newest first):\n")
	if len(s.History) == 0 {
		p("  none recorded\n")
	} else {
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  FINISHED\tCONFIG\tRESULT\tGPUS CHANGED\tEVICTED PODS\tREQUESTED BY\tREASON\n")
		for _, r := range s.History {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", formatTime(r.FinishedAt), orDash(r.Config),
				orDash(r.Result), formatInts(r.GPUsChanged), podList(r.EvictedPods, 2),
				requester(r.RequestedBy, r.RequestedVia), orDash(r.Reason))
		}
		_ = tw.Flush()
	}

	if len(s.Notes) > 0 {
		p("\nNotes:\n")
		for _, n := range s.Notes {
			p("  - %s\n", clean(n))
		}
	}
	return ew.err
}

// errWriter keeps the first write error and drops later writes.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(b []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(b)
	e.err = err
	return n, err
}

// clean replaces control characters (newlines, tabs, terminal escapes) so
// that text from annotations cannot break the layout or the terminal.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// shortDigests cuts every "sha256:<hex>" in s to 12 hex digits, as
// container tools print image ids; the full digests are in the last change.
func shortDigests(s string) string {
	const prefix, keep = "sha256:", 12
	var b strings.Builder
	for {
		i := strings.Index(s, prefix)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		j := i + len(prefix)
		k := j
		for k < len(s) && strings.IndexByte("0123456789abcdefABCDEF", s[k]) >= 0 {
			k++
		}
		b.WriteString(s[:j])
		b.WriteString(s[j:min(k, j+keep)])
		s = s[k:]
	}
}

// requester is "by via manager", or by alone where the field manager is
// unknown or the same name.
func requester(by, via string) string {
	if via == "" || via == by {
		return orDash(by)
	}
	return orDash(by) + " via " + clean(via)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return clean(s)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func formatDuration(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func formatInts(xs []int) string {
	if len(xs) == 0 {
		return "-"
	}
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ",")
}

// podList shows at most n pod names and how many more there are.
func podList(pods []string, n int) string {
	if len(pods) <= n {
		return orDash(strings.Join(pods, ","))
	}
	return clean(strings.Join(pods[:n], ",")) + fmt.Sprintf(" +%d more", len(pods)-n)
}

// profileSummary is "1x 3g.71gb, 2x 1g.18gb" in the order the profiles
// first appear on the GPU.
func profileSummary(g GPUGeometry) string {
	var parts []string
	seen := map[string]bool{}
	for _, in := range g.Instances {
		p, _ := splitInstance(in)
		if seen[p] {
			continue
		}
		seen[p] = true
		parts = append(parts, fmt.Sprintf("%dx %s", g.Profiles[p], clean(p)))
	}
	return orDash(strings.Join(parts, ", "))
}
