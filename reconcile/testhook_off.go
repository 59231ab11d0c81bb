//go:build !migagent_testhooks

package reconcile

// crashHook is the crash test hook of testhook.go, which a production build
// does not have.
func (d *Daemon) crashHook() {}
