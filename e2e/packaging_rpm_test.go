package e2e

// A reader of the RPM header (lead, signature header, main header), enough
// to check what build-packages.sh made where no rpm tool is installed. The
// format: https://rpm-software-management.github.io/rpm/manual/format_v4.html

import (
	"bytes"
	be "encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// RPM header tags and file flags read by the tests.
const (
	rpmTagName        = 1000
	rpmTagVersion     = 1001
	rpmTagPostIn      = 1024
	rpmTagPreUn       = 1025
	rpmTagPostUn      = 1026
	rpmTagFileModes   = 1030
	rpmTagFileFlags   = 1037
	rpmTagFileUser    = 1039
	rpmTagFileGroup   = 1040
	rpmTagRequireName = 1049
	// rpmTagConflictName: RPMTAG_CONFLICTNAME (rpm's lib/rpmtag.h).
	rpmTagConflictName = 1054
	rpmTagDirIndexes   = 1116
	rpmTagBaseNames    = 1117
	rpmTagDirNames     = 1118

	rpmFileConfig    = 1 << 0
	rpmFileNoReplace = 1 << 4
)

// RPM header data types.
const (
	rpmTypeInt16       = 3
	rpmTypeInt32       = 4
	rpmTypeString      = 6
	rpmTypeStringArray = 8
	rpmTypeI18NString  = 9
)

var errNotRPM = errors.New("not an RPM package")

type rpmEntry struct {
	typ, offset, count uint32
}

// rpmHeader is one parsed header: its index and data store.
type rpmHeader struct {
	entries map[int]rpmEntry
	data    []byte
}

// readRPMHeader returns the main header of the package at path.
func readRPMHeader(path string) (*rpmHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	lead := make([]byte, 96)
	if _, err := io.ReadFull(f, lead); err != nil {
		return nil, fmt.Errorf("%s: lead: %w", path, err)
	}
	if !bytes.Equal(lead[:4], []byte{0xed, 0xab, 0xee, 0xdb}) {
		return nil, fmt.Errorf("%s: %w (lead magic %x)", path, errNotRPM, lead[:4])
	}
	sig, err := readRPMHeaderStruct(f)
	if err != nil {
		return nil, fmt.Errorf("%s: signature header: %w", path, err)
	}
	if pad := (8 - len(sig.data)%8) % 8; pad > 0 {
		if _, err := io.CopyN(io.Discard, f, int64(pad)); err != nil {
			return nil, fmt.Errorf("%s: signature padding: %w", path, err)
		}
	}
	h, err := readRPMHeaderStruct(f)
	if err != nil {
		return nil, fmt.Errorf("%s: header: %w", path, err)
	}
	return h, nil
}

func readRPMHeaderStruct(r io.Reader) (*rpmHeader, error) {
	var intro struct {
		Magic    [4]byte
		Reserved [4]byte
		NIndex   uint32
		HSize    uint32
	}
	if err := be.Read(r, be.BigEndian, &intro); err != nil {
		return nil, err
	}
	if !bytes.Equal(intro.Magic[:], []byte{0x8e, 0xad, 0xe8, 0x01}) {
		return nil, fmt.Errorf("%w (header magic %x)", errNotRPM, intro.Magic)
	}
	if intro.NIndex > 1<<16 || intro.HSize > 64<<20 {
		return nil, fmt.Errorf("%w: header of %d entries, %d bytes", errNotRPM, intro.NIndex, intro.HSize)
	}
	h := &rpmHeader{entries: map[int]rpmEntry{}, data: make([]byte, intro.HSize)}
	for range intro.NIndex {
		var e struct{ Tag, Type, Offset, Count uint32 }
		if err := be.Read(r, be.BigEndian, &e); err != nil {
			return nil, err
		}
		if e.Offset > intro.HSize {
			return nil, fmt.Errorf("%w: tag %d at offset %d beyond %d", errNotRPM, e.Tag, e.Offset, intro.HSize)
		}
		h.entries[int(e.Tag)] = rpmEntry{e.Type, e.Offset, e.Count}
	}
	if _, err := io.ReadFull(r, h.data); err != nil {
		return nil, err
	}
	return h, nil
}

// Strings returns a STRING, STRING_ARRAY or I18NSTRING tag's values.
func (h *rpmHeader) Strings(tag int) []string {
	e, ok := h.entries[tag]
	if !ok || (e.typ != rpmTypeString && e.typ != rpmTypeStringArray && e.typ != rpmTypeI18NString) {
		return nil
	}
	var out []string
	rest := h.data[e.offset:]
	for range e.count {
		i := bytes.IndexByte(rest, 0)
		if i < 0 {
			break
		}
		out = append(out, string(rest[:i]))
		rest = rest[i+1:]
	}
	return out
}

// String returns a string tag's first value.
func (h *rpmHeader) String(tag int) string {
	if s := h.Strings(tag); len(s) > 0 {
		return s[0]
	}
	return ""
}

// Ints returns an INT16 or INT32 tag's values.
func (h *rpmHeader) Ints(tag int) []uint32 {
	e, ok := h.entries[tag]
	if !ok {
		return nil
	}
	var size uint32
	switch e.typ {
	case rpmTypeInt16:
		size = 2
	case rpmTypeInt32:
		size = 4
	default:
		return nil
	}
	if uint64(e.offset)+uint64(e.count)*uint64(size) > uint64(len(h.data)) {
		return nil
	}
	out := make([]uint32, e.count)
	for i := range out {
		b := h.data[e.offset+uint32(i)*size:]
		if size == 2 {
			out[i] = uint32(be.BigEndian.Uint16(b))
		} else {
			out[i] = be.BigEndian.Uint32(b)
		}
	}
	return out
}

// rpmFile is one file of the package.
type rpmFile struct {
	Mode        uint32
	Flags       uint32
	User, Group string
}

// Files returns the package's files by absolute path.
func (h *rpmHeader) Files() map[string]rpmFile {
	base, dirs, idx := h.Strings(rpmTagBaseNames), h.Strings(rpmTagDirNames), h.Ints(rpmTagDirIndexes)
	modes, flags := h.Ints(rpmTagFileModes), h.Ints(rpmTagFileFlags)
	users, groups := h.Strings(rpmTagFileUser), h.Strings(rpmTagFileGroup)
	out := map[string]rpmFile{}
	for i, b := range base {
		if i >= len(idx) || int(idx[i]) >= len(dirs) || i >= len(modes) || i >= len(flags) || i >= len(users) || i >= len(groups) {
			break
		}
		out[dirs[idx[i]]+b] = rpmFile{Mode: modes[i], Flags: flags[i], User: users[i], Group: groups[i]}
	}
	return out
}
