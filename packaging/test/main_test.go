package test

import (
	"log/slog"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	// Helm's loader logs each symlink under files/ at INFO (they are meant:
	// they share packaging/kubernetes with the chart); keep warnings.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(m.Run())
}
