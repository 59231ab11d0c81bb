package assign

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// FileName is the history file of a standalone agent, in its state
// directory beside the journal.
const FileName = "assignments.json"

// FileStore keeps the history in one JSON file (a standalone agent's,
// beside its journal), replaced atomically at every save: a reader never
// sees half of it, and a crash leaves the previous or the next version.
type FileStore struct {
	Path string
	Node string
}

// Load implements Store: empty where the file does not exist yet.
func (f *FileStore) Load(context.Context) (*History, error) {
	h, err := ReadFile(f.Path)
	if errors.Is(err, os.ErrNotExist) {
		return &History{Node: f.Node}, nil
	}
	if err != nil {
		return nil, err
	}
	h.Node = f.Node
	return h, nil
}

// Save implements Store.
func (f *FileStore) Save(_ context.Context, h *History) error {
	data, err := h.Encode()
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.Path), ".assignments-*")
	if err != nil {
		return fmt.Errorf("saving the assignment history: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("saving the assignment history: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("saving the assignment history: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("saving the assignment history: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.Path); err != nil {
		return fmt.Errorf("saving the assignment history: %w", err)
	}
	return nil
}

// ReadFile reads a history file.
func ReadFile(path string) (*History, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	h, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return h, nil
}
