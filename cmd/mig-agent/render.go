package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/migagent/mig-agent/geometry"
)

// The text the commands print for a person; the JSON forms are the
// agent's types as they are.

// writePlanText prints a plan for a person (mig-agent plan).
func writePlanText(w io.Writer, p *geometry.Plan) error {
	var b strings.Builder
	fmt.Fprintf(&b, "config %s (hash %.12s)\n", p.Config, p.Hash)
	if p.Strategy != "" {
		fmt.Fprintf(&b, "MIG strategy %s: the config can be served\n", p.Strategy)
	}
	for _, wn := range p.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", wn)
	}
	for _, g := range p.GPUs {
		if g.Action == geometry.ActionUntouched {
			fmt.Fprintf(&b, "GPU %d: untouched\n", g.Index)
			continue
		}
		fmt.Fprintf(&b, "GPU %d: change", g.Index)
		if g.ModeChange != geometry.ModeNone {
			fmt.Fprintf(&b, ", MIG mode %s", g.ModeChange)
		}
		if g.ResetNeeded {
			b.WriteString(", GPU reset needed")
		}
		b.WriteString("\n")
		for _, in := range g.Destroy {
			fmt.Fprintf(&b, "  destroy %s@%d\n", in.Name(), in.Start)
		}
		for _, in := range g.Keep {
			fmt.Fprintf(&b, "  keep    %s@%d\n", in.Name(), in.Start)
		}
		for _, in := range g.Create {
			fmt.Fprintf(&b, "  create  %s@%d\n", in.Name(), in.Start)
		}
		for _, c := range g.DestroyCompute {
			fmt.Fprintf(&b, "  destroy compute instance %s in %s@%d\n", c.Compute, c.Profile, c.Start)
		}
		for _, c := range g.CreateCompute {
			fmt.Fprintf(&b, "  create  compute instance %s in %s@%d\n", c.Compute, c.Profile, c.Start)
		}
		for _, pod := range g.Evict {
			fmt.Fprintf(&b, "  evict   %s\n", pod)
		}
	}
	if p.RebootNeeded {
		b.WriteString("reboot needed: a MIG mode change cannot take effect without one (GPU reset unavailable)\n")
	} else {
		b.WriteString("no reboot needed\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
