// Package text holds the small string rules the agent applies in more than
// one place.
package text

import "unicode/utf8"

// Ellipsis ends a cut string.
const Ellipsis = "…"

// Truncate cuts s to at most n bytes at a rune boundary (never inside a
// UTF-8 sequence), ending it with Ellipsis when it cut. Kubernetes and
// Prometheus bound some free-text fields in bytes: an Event's message, a
// label value.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n < len(Ellipsis) {
		cut := n
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return s[:cut]
	}
	cut := n - len(Ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + Ellipsis
}
