package profiles

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseName(t *testing.T) {
	tests := []struct {
		in     string
		want   Name
		str    string // canonical String(); "" means in
		suffix string // ConfigSuffix(); "" means str
	}{
		{"1g.18gb", Name{C: 1, G: 1, GB: 18}, "", ""},
		{"7g.141gb", Name{C: 7, G: 7, GB: 141}, "", ""},
		{"1c.3g.40gb", Name{C: 1, G: 3, GB: 40}, "", ""},
		{"3c.3g.40gb", Name{C: 3, G: 3, GB: 40}, "3g.40gb", ""},
		{"1g.18gb+me", Name{C: 1, G: 1, GB: 18, Attrs: []string{"me"}}, "", "1g.18gb.me"},
		{"1g.24gb+me.all", Name{C: 1, G: 1, GB: 24, Attrs: []string{"me.all"}}, "", "1g.24gb.me.all"},
		{"2g.48gb+gfx", Name{C: 2, G: 2, GB: 48, Attrs: []string{"gfx"}}, "", "2g.48gb.gfx"},
		{"1g.24gb-me", Name{C: 1, G: 1, GB: 24, NegAttrs: []string{"me"}}, "", "1g.24gb-me"},
		{"1g.24gb+me,gfx", Name{C: 1, G: 1, GB: 24, Attrs: []string{"me", "gfx"}}, "", "1g.24gb.me,gfx"},
		{"1c.2g.10gb+me", Name{C: 1, G: 2, GB: 10, Attrs: []string{"me"}}, "", "1c.2g.10gb.me"},
		{"1g.5gb+ME", Name{C: 1, G: 1, GB: 5, Attrs: []string{"ME"}}, "", "1g.5gb.ME"},
		{"9999g.9999gb", Name{C: 9999, G: 9999, GB: 9999}, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := Parse(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v; want %+v", got, tc.want)
			}
			str := tc.str
			if str == "" {
				str = tc.in
			}
			if got.String() != str {
				t.Fatalf("String() = %q; want %q", got.String(), str)
			}
			suffix := tc.suffix
			if suffix == "" {
				suffix = str
			}
			if got.ConfigSuffix() != suffix {
				t.Fatalf("ConfigSuffix() = %q; want %q", got.ConfigSuffix(), suffix)
			}
		})
	}
}

func TestParseNameErrors(t *testing.T) {
	tests := []struct{ in, why string }{
		{"", "empty"},
		{"1g", "want [Cc.]Gg.GBgb"},
		{"1g.5gb.1c", `missing "c" in "1g"`},
		{"1.5gb", `missing "g" in "1"`},
		{"1g.5", `missing "gb" in "5"`},
		{"g.5gb", `bad number in "g"`},
		{"0g.5gb", `"0g" must be positive`},
		{"1g.0gb", `"0gb" must be positive`},
		{"-1g.5gb", "want [Cc.]Gg.GBgb"},
		{"1g.5gb+", "empty attribute"},
		{"1g.5gb+me,", "empty attribute"},
		{"1g.5gb+me,me", `attribute "me" repeated`},
		{"1g.5gb+1me", "begins with a digit"},
		{"1g.5gb+.me", "begins or ends with a dot"},
		{"1g.5gb+me.", "begins or ends with a dot"},
		{"1g.5gb+m_e", "other than letters, digits and dots"},
		{"1g.5gb+me-gfx", "both + and -"},
		{"4c.3g.40gb", "more compute slices than GPU slices"},
		{"1c.2c.3g.40gb", "want [Cc.]Gg.GBgb"},
		{"12345g.5gb", "bad number"},
		{"1g.5gb ", `missing "gb"`},
		{" 1g.5gb", "bad number"},
		{"1g.5GB", `missing "gb"`},
		{"１g.5gb", "bad number"},
		{strings.Repeat("1", 70) + "g.5gb", "longer than 64 characters"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			n, err := Parse(tc.in)
			if err == nil {
				t.Fatalf("parsed as %+v", n)
			}
			if !errors.Is(err, ErrBadName) || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("error %q; want it to contain %q", err, tc.why)
			}
		})
	}
}

func TestNameEqualAndGI(t *testing.T) {
	a, _ := Parse("1g.24gb+me,gfx")
	b, _ := Parse("1g.24gb+gfx,me")
	c, _ := Parse("1g.24gb+gfx")
	d, _ := Parse("1g.24gb-gfx")
	if !a.Equal(b) || a.Equal(c) || c.Equal(d) {
		t.Fatal("attributes must compare as sets, + apart from -")
	}
	ci, _ := Parse("2c.4g.40gb+me")
	if gi := ci.GI(); gi.String() != "4g.40gb+me" || gi.IsCompute() || !ci.IsCompute() {
		t.Fatalf("GI of %s is %s", ci, gi)
	}
}

func TestMemoryGB(t *testing.T) {
	tests := []struct {
		mib, total uint64
		want       int
	}{
		{16384, 150754820096, 18},   // H200 1g
		{33280, 150754820096, 35},   // H200 1g.35gb
		{71424, 150754820096, 71},   // H200 3g
		{143360, 150754820096, 141}, // H200 7g
		{0, 0, 0},
	}
	for _, tc := range tests {
		if got := MemoryGB(tc.mib, tc.total); got != tc.want {
			t.Errorf("MemoryGB(%d, %d) = %d; want %d", tc.mib, tc.total, got, tc.want)
		}
	}
	if got := ProfileName(Index1SliceRev1, 16384, 150754820096); got != "1g.18gb+me" {
		t.Errorf("ProfileName = %q", got)
	}
}
