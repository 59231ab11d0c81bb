package profiles

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Attribute names used in profile names.
const (
	AttrMediaExtensions    = "me"     // +me: the profile owns the media engines
	AttrMediaExtensionsAll = "me.all" // +me.all: all media engines of the GPU
	AttrGraphics           = "gfx"    // +gfx: graphics capable
)

// maxNameLen bounds what Parse accepts; real names are under 24 characters.
const maxNameLen = 64

// Name is a parsed MIG profile name: [Cc.]Gg.GBgb[+attr,...|-attr,...].
// C equals G for a GPU instance profile (the compute instance spans the
// whole GPU instance); C < G names a compute-instance profile inside a GPU
// instance of G slices.
type Name struct {
	C, G, GB int
	// Attrs are the positive attributes (+me, +me.all, +gfx), NegAttrs the
	// negative ones (-me). At most one of the two is non-empty.
	Attrs, NegAttrs []string
}

// ErrBadName is wrapped by every Parse error.
var ErrBadName = errors.New("invalid MIG profile name")

// Parse parses a profile name strictly, with the grammar of go-nvlib's
// ParseMigProfile: "1g.10gb", "1c.3g.20gb", "1g.10gb+me", "1g.24gb-me",
// "1g.24gb+me.all", "2g.48gb+gfx".
func Parse(s string) (Name, error) {
	bad := func(why string) (Name, error) {
		return Name{}, fmt.Errorf("%w %q: %s", ErrBadName, s, why)
	}
	if s == "" {
		return bad("empty")
	}
	if len(s) > maxNameLen {
		return Name{}, fmt.Errorf("%w: longer than %d characters", ErrBadName, maxNameLen)
	}
	base, attrs, neg := s, "", false
	plus, minus := strings.IndexByte(s, '+'), strings.IndexByte(s, '-')
	switch {
	case plus >= 0 && minus >= 0:
		return bad("has both + and - attributes")
	case plus >= 0:
		base, attrs = s[:plus], s[plus+1:]
	case minus >= 0:
		base, attrs, neg = s[:minus], s[minus+1:], true
	}
	parts := strings.Split(base, ".")
	var n Name
	var err error
	switch len(parts) {
	case 2:
		if n.G, err = field(parts[0], "g"); err != nil {
			return bad(err.Error())
		}
		n.C = n.G
		if n.GB, err = field(parts[1], "gb"); err != nil {
			return bad(err.Error())
		}
	case 3:
		if n.C, err = field(parts[0], "c"); err != nil {
			return bad(err.Error())
		}
		if n.G, err = field(parts[1], "g"); err != nil {
			return bad(err.Error())
		}
		if n.GB, err = field(parts[2], "gb"); err != nil {
			return bad(err.Error())
		}
		if n.C > n.G {
			return bad("more compute slices than GPU slices")
		}
	default:
		return bad("want [Cc.]Gg.GBgb")
	}
	if plus >= 0 || minus >= 0 {
		list, err := parseAttrs(attrs)
		if err != nil {
			return bad(err.Error())
		}
		if neg {
			n.NegAttrs = list
		} else {
			n.Attrs = list
		}
	}
	return n, nil
}

func field(s, suffix string) (int, error) {
	num, ok := strings.CutSuffix(s, suffix)
	if !ok {
		return 0, fmt.Errorf("missing %q in %q", suffix, s)
	}
	if num == "" || len(num) > 4 {
		return 0, fmt.Errorf("bad number in %q", s)
	}
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("bad number in %q", s)
		}
	}
	v, _ := strconv.Atoi(num)
	if v <= 0 {
		return 0, fmt.Errorf("%q must be positive", s)
	}
	return v, nil
}

func parseAttrs(s string) ([]string, error) {
	list := strings.Split(s, ",")
	for i, a := range list {
		if a == "" {
			return nil, errors.New("empty attribute")
		}
		if a[0] >= '0' && a[0] <= '9' {
			return nil, fmt.Errorf("attribute %q begins with a digit", a)
		}
		if a[0] == '.' || a[len(a)-1] == '.' {
			return nil, fmt.Errorf("attribute %q begins or ends with a dot", a)
		}
		for _, c := range a {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.') {
				return nil, fmt.Errorf("attribute %q has a character other than letters, digits and dots", a)
			}
		}
		if slices.Contains(list[:i], a) {
			return nil, fmt.Errorf("attribute %q repeated", a)
		}
	}
	return list, nil
}

// String prints the canonical form: "1g.18gb", "1c.3g.40gb", "1g.18gb+me".
func (n Name) String() string {
	var b strings.Builder
	if n.C != n.G {
		fmt.Fprintf(&b, "%dc.", n.C)
	}
	fmt.Fprintf(&b, "%dg.%dgb", n.G, n.GB)
	if len(n.Attrs) > 0 {
		b.WriteString("+" + strings.Join(n.Attrs, ","))
	} else if len(n.NegAttrs) > 0 {
		b.WriteString("-" + strings.Join(n.NegAttrs, ","))
	}
	return b.String()
}

// GI returns the name of the GPU instance profile that holds n (n itself
// for a GPU instance profile; "3g.40gb" for "1c.3g.40gb").
func (n Name) GI() Name {
	n.C = n.G
	return n
}

// IsCompute reports whether n names a compute instance smaller than its GPU
// instance.
func (n Name) IsCompute() bool { return n.C != n.G }

// Equal compares two names, attributes as sets.
func (n Name) Equal(o Name) bool {
	return n.C == o.C && n.G == o.G && n.GB == o.GB &&
		sameSet(n.Attrs, o.Attrs) && sameSet(n.NegAttrs, o.NegAttrs)
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// ConfigSuffix is the name as it appears in generated config names, with
// '+' written as '.': "1g.18gb+me" → "1g.18gb.me". A '-' stays.
func (n Name) ConfigSuffix() string { return strings.ReplaceAll(n.String(), "+", ".") }

// MemoryGB computes the "gb" part of a profile name from the profile's
// memory and the GPU's total memory, with NVIDIA's rule (go-nvlib
// getMigMemorySizeGB): the memory fraction is rounded up to eighths and
// applied to the total rounded up to whole GiB.
func MemoryGB(profileMiB, totalBytes uint64) int {
	const oneMiB, oneGiB = 1 << 20, 1 << 30
	if totalBytes == 0 {
		return 0
	}
	frac := float64(profileMiB) * oneMiB / float64(totalBytes)
	frac = math.Ceil(frac*8) / 8
	totalGB := float64((totalBytes + oneGiB - 1) / oneGiB)
	return int(math.Round(frac * totalGB))
}
