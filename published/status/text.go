package status

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/record"
)

// WriteText writes the status for a person (mig-agent status): the
// configs and state, the per-GPU geometry, the last change in full and the
// history as a table. Text from the annotations is printed with control
// characters replaced.
func WriteText(w io.Writer, s *Status) error {
	ew := &errWriter{w: w}
	writeSummary(ew, s)
	writeGeometry(ew, s)
	writeLastChange(ew, s.LastChange)
	writeHistory(ew, s.History, s.HistoryFrom)
	if len(s.Notes) > 0 {
		fmt.Fprintf(ew, "\nNotes:\n")
		for _, n := range s.Notes {
			fmt.Fprintf(ew, "  - %s\n", clean(n))
		}
	}
	return ew.err
}

// writeSummary writes the node, its configs and state, and who asked.
func writeSummary(w io.Writer, s *Status) {
	fmt.Fprintf(w, "Node:      %s\n", clean(s.Node))
	fmt.Fprintf(w, "Desired:   %s\n", orDash(s.Desired))
	fmt.Fprintf(w, "State:     %s\n", orDash(s.State))
	if a := s.Applied; a != nil {
		extra := []string{"at " + formatTime(a.At)}
		if a.Hash != "" {
			extra = append(extra, "hash "+shortDigests(clean(a.Hash)))
		}
		if a.Source != "" {
			extra = append(extra, "from "+shortDigests(clean(a.Source)))
		}
		fmt.Fprintf(w, "Applied:   %s (%s)\n", clean(a.Config), strings.Join(extra, ", "))
	} else {
		fmt.Fprintf(w, "Applied:   - (no successful change recorded)\n")
	}
	if s.Strategy != "" {
		fmt.Fprintf(w, "Strategy:  %s\n", clean(s.Strategy))
	}
	if r := s.Requester; r != nil {
		how := map[string]string{
			published.RequesterFromAdmission:     "authenticated by the API server",
			published.RequesterFromManagedFields: "field manager from managedFields, a name the client chose",
		}[r.Source]
		if how == "" {
			how = "neither the requester stamp nor managedFields name who set the label, or the stamp does not parse"
		}
		at := ""
		if r.At != nil {
			at = " at " + formatTime(*r.At)
		}
		src := ""
		if r.Source != "" {
			src = " [" + clean(r.Source) + "]"
		}
		fmt.Fprintf(w, "Requested: %s%s (%s)%s\n", requester(r.By, r.Via, ""), at, how, src)
	}
}

// writeGeometry writes the per-GPU geometry table.
func writeGeometry(w io.Writer, s *Status) {
	fmt.Fprintf(w, "\nGPU geometry")
	if s.GeometryAt != nil {
		fmt.Fprintf(w, " (after the change finished %s)", formatTime(*s.GeometryAt))
	}
	fmt.Fprintf(w, ":\n")
	if len(s.GPUs) == 0 {
		fmt.Fprintf(w, "  none recorded\n")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  GPU\tPROFILES\tINSTANCES (profile@start)\n")
	for _, g := range s.GPUs {
		fmt.Fprintf(tw, "  %d\t%s\t%s\n", g.Index, profileSummary(g), orDash(strings.Join(g.Instances, " ")))
	}
	_ = tw.Flush()
}

// writeLastChange writes the last change record in full.
func writeLastChange(w io.Writer, r *record.ChangeRecord) {
	fmt.Fprintf(w, "\nLast change:\n")
	if r == nil {
		fmt.Fprintf(w, "  none recorded\n")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
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
	pods := orDash(strings.Join(r.EvictedPods, ", "))
	if r.EvictedPodsOmitted > 0 {
		pods += fmt.Sprintf(" (+%d more, not named here)", r.EvictedPodsOmitted)
	}
	row("Evicted pods", pods)
	if r.AffectedBy != "" {
		row("Pods found by", clean(r.AffectedBy))
	}
	if r.ServedBy != "" {
		row("Served by", clean(r.ServedBy))
	}
	row("Reboot", yesNo(r.Reboot))
	if r.ResourcesConverged != nil {
		row("Resources advertised", yesNo(*r.ResourcesConverged))
	}
	req := requester(r.RequestedBy, r.RequestedVia, r.RequestedBySource)
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

// writeHistory writes the history as a table, newest first.
func writeHistory(w io.Writer, history []record.ChangeRecord, from string) {
	fmt.Fprintf(w, "\nHistory (newest first):\n")
	if from != "" {
		fmt.Fprintf(w, "  (the records whole, from %s)\n", clean(from))
	}
	if len(history) == 0 {
		fmt.Fprintf(w, "  none recorded\n")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  FINISHED\tCONFIG\tRESULT\tGPUS CHANGED\tEVICTED PODS\tREQUESTED BY\tREASON\n")
	for _, r := range history {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", formatTime(r.FinishedAt), orDash(r.Config),
			orDash(r.Result), formatInts(r.GPUsChanged), podList(r.EvictedPods, 2, r.EvictedPodsOmitted),
			requester(r.RequestedBy, r.RequestedVia, r.RequestedBySource), orDash(r.Reason))
	}
	_ = tw.Flush()
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

// requester names who asked: "by via manager", or by alone where the
// field manager is unknown or the same name, and where the name comes from
// (source, the record's requestedBySource, when given).
func requester(by, via, source string) string {
	s := orDash(by)
	if via != "" && via != by {
		s += " via " + clean(via)
	}
	if source != "" {
		s += " [" + clean(source) + "]"
	}
	return s
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
func podList(pods []string, n, omitted int) string {
	more := omitted + max(len(pods)-n, 0)
	pods = pods[:min(n, len(pods))]
	switch {
	case more == 0:
		return orDash(clean(strings.Join(pods, ",")))
	case len(pods) == 0:
		return fmt.Sprintf("%d, not named here", more)
	}
	return clean(strings.Join(pods, ",")) + fmt.Sprintf(" +%d more", more)
}

// profileSummary is "1x 3g.71gb, 2x 1g.18gb" in the order the profiles
// first appear on the GPU.
func profileSummary(g record.GPUGeometry) string {
	var parts []string
	seen := map[string]bool{}
	for _, in := range g.Instances {
		p, _ := record.SplitInstance(in)
		if seen[p] {
			continue
		}
		seen[p] = true
		parts = append(parts, fmt.Sprintf("%dx %s", g.Profiles[p], clean(p)))
	}
	return orDash(strings.Join(parts, ", "))
}
