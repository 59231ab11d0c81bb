package reconcile

import "github.com/migagent/mig-agent/gpus"

// reloadFile re-reads the config file (-f) at the start of every pass, so
// that a config added to the file is found and the records' configSource
// names the file as it is now, not as it was at start. A file that no
// longer reads or parses keeps the pass from acting on a stale copy: the
// attempt fails with the reason (and is retried), the copy read last stays
// for the drift check.
func (d *Daemon) reloadFile() {
	if d.S == nil || d.S.ConfigFile == "" {
		return
	}
	f, err := gpus.LoadConfigFile(d.S.ConfigFile)
	if err != nil {
		if d.fileErr == nil || d.fileErr.Error() != err.Error() {
			d.Log.Error("re-reading the config file failed", "path", d.S.ConfigFile, "err", err)
		}
		d.fileErr = err
		return
	}
	if d.File != nil && d.File.SHA256 != f.SHA256 {
		d.Log.Info("the config file changed", "path", f.Path, "sha256", f.SHA256)
	}
	d.File, d.fileErr = f, nil
}
