package profiles

import (
	"errors"
	"testing"
)

// FuzzParseName: no input panics; every accepted name prints to a
// canonical form that parses back equal, prints the same again, and keeps
// its GPU instance part.
func FuzzParseName(f *testing.F) {
	for _, s := range []string{
		"1g.18gb", "1g.18gb+me", "1c.3g.40gb", "1g.24gb-me", "1g.24gb+me.all", "2g.48gb+gfx",
		"1g.24gb+me,gfx", "3c.3g.40gb", "7g.141gb", "", "1g", "1g.5gb+", "1g.5gb+me-gfx",
		"4c.3g.40gb", "0g.1gb", "1g.5gb+me,me", "9999c.9999g.9999gb+a.b.c,d",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrBadName) {
				t.Fatalf("error without ErrBadName: %v", err)
			}
			return
		}
		if n.C <= 0 || n.G <= 0 || n.GB <= 0 || n.C > n.G || len(n.Attrs) > 0 && len(n.NegAttrs) > 0 {
			t.Fatalf("%q parsed to impossible %+v", s, n)
		}
		str := n.String()
		back, err := Parse(str)
		if err != nil {
			t.Fatalf("%q prints as %q, which does not parse: %v", s, str, err)
		}
		if !back.Equal(n) || back.String() != str {
			t.Fatalf("%q → %q → %+v", s, str, back)
		}
		gi := n.GI()
		if gi.IsCompute() || gi.G != n.G || gi.GB != n.GB || !n.IsCompute() && !gi.Equal(n) {
			t.Fatalf("GI of %+v is %+v", n, gi)
		}
		_ = n.ConfigSuffix()
	})
}
