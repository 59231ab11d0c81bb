package assign

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteText writes the history for a person: one line per assignment,
// oldest first, open ones with end "(held)", and the dropped-entries note.
// Names are written as they are only where they hold nothing but letters,
// digits and . - _ /; anything else is quoted, so a name cannot make a line
// of its own or shift the columns.
func WriteText(w io.Writer, h *History) error {
	if h.Node != "" {
		fmt.Fprintf(w, "Node %s: %d assignments", safe(h.Node), len(h.Entries))
		if h.Dropped > 0 {
			fmt.Fprintf(w, " (%s)", h.DroppedNote)
		}
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "START\tEND\tPOD\tCONTAINER\tDEVICE\tPROFILE\tGPU\tPLACEMENT\tCONFIG")
	for _, e := range h.Entries {
		end := "(held)"
		if e.End != nil {
			end = e.End.UTC().Format(time.RFC3339)
		}
		gpu, config := "?", "-"
		if e.Device.GPU >= 0 {
			gpu = strconv.Itoa(e.Device.GPU)
		}
		if e.Change != nil {
			config = safe(e.Change.Config)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s/%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Start.UTC().Format(time.RFC3339), end,
			safe(e.Namespace), safe(e.Pod), safe(e.Container), safe(e.Device.UUID), dash(safe(e.Device.Profile)), gpu,
			dash(safe(e.Device.Placement)), config)
	}
	return tw.Flush()
}

// safe is s where it holds only [A-Za-z0-9._/+-], else s quoted.
func safe(s string) string {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._/+-", r)) {
			return strconv.QuoteToASCII(s)
		}
	}
	return s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
