package record

import (
	"fmt"
	"unicode/utf8"
)

// The one cut of a text to a bound in bytes, at a rune boundary (never
// inside a UTF-8 sequence). It lives here because the record's own bounds
// use it and record imports nothing of the agent; the Event messages, the
// log excerpts and the Prometheus label values of the other packages use it
// through Truncate.

// Ellipsis ends a text Truncate cut.
const Ellipsis = "…"

// Truncate cuts s to at most n bytes at a rune boundary, ending it with
// Ellipsis when it cut. Kubernetes and Prometheus bound some free-text
// fields in bytes: an Event's message, a label value.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n < len(Ellipsis) {
		return runePrefix(s, n)
	}
	return runePrefix(s, n-len(Ellipsis)) + Ellipsis
}

// BoundText cuts s to at most limit bytes (at a rune boundary), marked with
// TruncatedMark and its whole length.
func BoundText(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	suffix := fmt.Sprintf("%s%d bytes in all]", TruncatedMark, len(s))
	return runePrefix(s, limit-len(suffix)) + suffix
}

// CapReason shortens reason to MaxRecordReason bytes (at a rune boundary),
// saying how much was left out and where the whole text is.
func CapReason(reason string) string {
	if len(reason) <= MaxRecordReason {
		return reason
	}
	suffix := fmt.Sprintf(" … (%d bytes in all; the whole reason is in the agent's log)", len(reason))
	return runePrefix(reason, MaxRecordReason-len(suffix)) + suffix
}

// runePrefix is the longest start of s of at most n bytes (none when n is
// not positive) that ends at a rune boundary.
func runePrefix(s string, n int) string {
	if n >= len(s) {
		return s
	}
	cut := max(n, 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
