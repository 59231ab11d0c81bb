package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestGeneratedFilesUpToDate fails when exports.go or go-nvml's nvml.h
// changed and `go generate ./nvmlx/simlib` was not run.
func TestGeneratedFilesUpToDate(t *testing.T) {
	files, err := Generate("..")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		have, err := os.ReadFile(filepath.Join("..", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(have, want) {
			t.Errorf("%s is stale: run go generate ./nvmlx/simlib", name)
		}
	}
}

// TestDeclaredFunctions reads both prototype forms of nvml.h.
func TestDeclaredFunctions(t *testing.T) {
	h := "nvmlReturn_t DECLDIR nvmlInit_v2(void);\nconst DECLDIR char* nvmlErrorString(nvmlReturn_t result);\n" +
		"DEPRECATED(13.0) nvmlReturn_t DECLDIR nvmlDeviceGetTemperature(nvmlDevice_t device);\nnvmlReturn_t DECLDIR nvmlInit_v2(void);\n"
	got := declaredFunctions(h)
	want := []string{"nvmlDeviceGetTemperature", "nvmlErrorString", "nvmlInit_v2"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}
