package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
)

// buildNode mounts the node's view in this (new) mount namespace: a tmpfs
// at stage holds every file, and bind mounts put them in place. Mounts are
// made private first, so nothing propagates to the host.
func buildNode(stage string, gpus []gpu) error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private (sim-node needs root): %w", err)
	}
	if err := syscall.Mount("sim-node", stage, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("tmpfs at %s: %w", stage, err)
	}
	driverDir := filepath.Join(stage, "sys-bus-pci-drivers", "nvidia")
	if err := os.MkdirAll(driverDir, 0o755); err != nil {
		return err
	}
	for _, step := range []func(string, []gpu) error{devDir, pciDir} {
		if err := step(stage, gpus); err != nil {
			return err
		}
	}
	return procDir(stage, gpus)
}

// writeFiles creates fs below root.
func writeFiles(root string, files []file) error {
	for _, f := range files {
		p := filepath.Join(root, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		var err error
		switch {
		case f.Dir:
			err = os.MkdirAll(p, 0o755)
		case f.Link != "":
			err = os.Symlink(f.Link, p)
		case f.Major > 0:
			if err = syscall.Mknod(p, syscall.S_IFCHR|0o666, int(mkdev(f.Major, f.Minor))); err == nil {
				err = os.Chmod(p, 0o666) // mknod applies the umask
			}
		default:
			err = os.WriteFile(p, []byte(f.Content), 0o444)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// mkdev packs a device number as Linux's makedev does.
func mkdev(major, minor int) uint64 {
	ma, mi := uint64(major), uint64(minor)
	return (ma&0xfff)<<8 | (ma&^0xfff)<<32 | (mi & 0xff) | (mi&^0xff)<<12
}

func bind(src, dst string) error {
	if err := syscall.Mount(src, dst, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, dst, err)
	}
	return nil
}

// mirror makes dst (in the tmpfs) show the host's src: a symlink is
// copied, a directory or a file gets a bind mount of the original, so
// that the host's entries stay as they are beside the simulated ones.
func mirror(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	case fi.IsDir():
		if err := os.Mkdir(dst, fi.Mode().Perm()); err != nil {
			return err
		}
	default:
		if err := os.WriteFile(dst, nil, 0o600); err != nil {
			return err
		}
	}
	return bind(src, dst)
}

// devDir puts the driver's device nodes beside the host's /dev.
func devDir(stage string, gpus []gpu) error {
	dev := filepath.Join(stage, "dev")
	if err := os.Mkdir(dev, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir("/dev")
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := mirror(filepath.Join("/dev", e.Name()), filepath.Join(dev, e.Name())); err != nil {
			return fmt.Errorf("/dev/%s: %w", e.Name(), err)
		}
	}
	ours := devFiles(gpus)
	for _, f := range ours {
		if _, err := os.Lstat(filepath.Join(dev, f.Path)); err == nil && !f.Dir {
			return fmt.Errorf("/dev/%s exists on this host: is NVIDIA's driver installed? sim-node is for hosts without it", f.Path)
		}
	}
	if err := writeFiles(dev, ours); err != nil {
		return err
	}
	return bind(dev, "/dev")
}

// pciDir puts the GPUs' PCI devices beside the host's in
// /sys/bus/pci/devices, whose entries are relative links into /sys/devices
// and so stay valid when copied.
func pciDir(stage string, gpus []gpu) error {
	const host = "/sys/bus/pci/devices"
	dir := filepath.Join(stage, "pci-devices")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(host)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, e := range entries {
		if err := mirror(filepath.Join(host, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	driver := filepath.Join(stage, "sys-bus-pci-drivers", "nvidia")
	for _, g := range gpus {
		if _, err := os.Lstat(filepath.Join(dir, g.BusID)); err == nil {
			return fmt.Errorf("PCI device %s exists on this host: pick GPUs at other addresses", g.BusID)
		}
		if err := writeFiles(dir, pciFiles(g, driver)); err != nil {
			return err
		}
	}
	if _, err := os.Stat(host); err != nil {
		return fmt.Errorf("%s: %w", host, err)
	}
	return bind(dir, host)
}

// procDir puts the driver's files into /proc: over /proc/modules,
// /proc/devices and /proc/driver where the kernel has them, else a /proc
// of links to the real one with those entries added.
func procDir(stage string, gpus []gpu) error {
	mods, modErr := os.ReadFile("/proc/modules")
	devs, err := os.ReadFile("/proc/devices")
	if err != nil {
		return err
	}
	files := []file{
		{Path: "modules", Content: procModules(string(mods))},
		{Path: "devices", Content: procDevices(string(devs))},
	}
	for _, f := range procDriverFiles(gpus, nvmlsim.DriverVersion) {
		f.Path = "driver/" + f.Path
		files = append(files, f)
	}
	own := filepath.Join(stage, "proc")
	if err := writeFiles(own, files); err != nil {
		return err
	}
	if modErr == nil {
		for _, name := range []string{"modules", "devices", "driver"} {
			if err := bind(filepath.Join(own, name), filepath.Join("/proc", name)); err != nil {
				return err
			}
		}
		return nil
	}
	return procFarm(stage, own)
}

// procFarm replaces /proc by the tmpfs directory own, which holds the
// simulated entries and links every other entry of the real proc file
// system (bound at stage/real-proc); keepFarm then adds and removes the
// links of process ids as processes come and go.
func procFarm(stage, own string) error {
	real := filepath.Join(stage, "real-proc")
	if err := os.Mkdir(real, 0o555); err != nil {
		return err
	}
	if err := bind("/proc", real); err != nil {
		return err
	}
	if err := syncFarm(real, own); err != nil {
		return err
	}
	farm = &procLinks{real: real, own: own}
	return bind(own, "/proc")
}

// farm is the /proc of links, when procFarm made one.
var farm *procLinks

type procLinks struct{ real, own string }

// syncFarm links every entry of real into own that own lacks, and drops
// the links of process ids that are gone.
func syncFarm(real, own string) error {
	entries, err := os.ReadDir(real)
	if err != nil {
		return err
	}
	present := map[string]bool{}
	for _, e := range entries {
		present[e.Name()] = true
		if _, err := os.Lstat(filepath.Join(own, e.Name())); err == nil {
			continue // simulated, or linked already
		}
		if err := os.Symlink(filepath.Join(real, e.Name()), filepath.Join(own, e.Name())); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	mine, err := os.ReadDir(own)
	if err != nil {
		return err
	}
	for _, e := range mine {
		if _, err := strconv.Atoi(e.Name()); err == nil && !present[e.Name()] {
			_ = os.Remove(filepath.Join(own, e.Name()))
		}
	}
	return nil
}

// keepFarm keeps the /proc links current every interval until done is
// closed: a process started after sim-node set up shows in /proc within
// an interval (its /proc/self works at once).
func keepFarm(done <-chan struct{}, every time.Duration) {
	if farm == nil {
		return
	}
	for {
		select {
		case <-done:
			return
		case <-time.After(every):
			_ = syncFarm(farm.real, farm.own)
		}
	}
}
