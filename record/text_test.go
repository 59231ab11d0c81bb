package record

import (
	"testing"
	"unicode/utf8"
)

func TestTruncate(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"0123456789abc", 10, "0123456…"},
		{"ääääää", 8, "ää…"},  // never cuts inside a rune
		{"ääääää", 9, "äää…"}, // exactly fits
		{"abcdef", 2, "ab"},   // no room for the mark
		{"äbcdef", 1, ""},     // nor for the rune
		{"", 0, ""},
	}
	for _, tt := range tests {
		got := Truncate(tt.in, tt.n)
		if got != tt.want || len(got) > tt.n && len(tt.in) > tt.n || !utf8.ValidString(got) {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}
