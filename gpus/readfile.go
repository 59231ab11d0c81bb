package gpus

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// MaxUserFile bounds what is read of a file the user names (-f, --settings).
const MaxUserFile = 1 << 20

// ErrNotRegularFile: a file the user names is a device, a FIFO, a socket or
// a directory, none of which a config or settings file can be.
var ErrNotRegularFile = errors.New("not a regular file")

// ReadUserFile reads a file the user named, at most limit bytes. Only
// regular files are read: /dev/zero would never end and a FIFO would block
// until someone writes to it. The file is opened without blocking and its
// type checked again on the open descriptor (the path may have been
// replaced in between), and the limit holds while reading, whatever the
// file's size said: a file that grows, or lies in stat (/proc), is still
// cut off at limit+1 bytes and refused.
func ReadUserFile(path string, limit int64) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w (%s)", path, ErrNotRegularFile, describeMode(st.Mode()))
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err = f.Stat(); err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w (%s)", path, ErrNotRegularFile, describeMode(st.Mode()))
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: at least %d bytes, more than the %d allowed", path, len(data), limit)
	}
	return data, nil
}

func describeMode(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	}
	return "type " + m.Type().String()
}
