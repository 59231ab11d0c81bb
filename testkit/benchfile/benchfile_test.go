package benchfile

import (
	"os"
	"path/filepath"
	"testing"
)

// Each bench's key is written, the others' kept; a file that is not a JSON
// object is refused and left as it is.
func TestMerge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bench-results.json")
	if err := MergeKey(path, "a", map[string]int{"x": 1}); err != nil {
		t.Fatal(err)
	}
	if err := MergeKey(path, "b", 2); err != nil {
		t.Fatal(err)
	}
	if err := MergeKey(path, "a", 3); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "{\n  \"a\": 3,\n  \"b\": 2\n}\n" {
		t.Errorf("merged: %q", b)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte("[1]"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := MergeKey(bad, "a", 1); err == nil {
		t.Error("a file that is not an object was overwritten")
	}
	if b, _ := os.ReadFile(bad); string(b) != "[1]" {
		t.Errorf("bad file now %q", b)
	}
}
