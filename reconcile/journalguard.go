package reconcile

import (
	"errors"
	"fmt"
)

// No journal, no change: every step is journaled before it starts, so a
// journal that cannot be written (a read-only or full state dir) stops the
// change before anything is touched, with the state failed and the reason
// in the record, an Event, the metrics and /readyz.

// mustJournal writes the journal and says whether it worked: a step that
// could not be journaled must not start.
func (d *Daemon) mustJournal() error {
	d.saveJournal()
	if err := d.Journal.Err(); err != nil {
		return fmt.Errorf("the journal %s cannot be written, so nothing is changed: %w", d.Journal.Path(), err)
	}
	return nil
}

// degraded says why the daemon is up but must not be counted ready.
func (d *Daemon) degraded() error {
	if d.api.Down() {
		return errors.New("not ready: the API server is unreachable")
	}
	if err := d.Journal.Err(); err != nil {
		return fmt.Errorf("not ready: the journal %s cannot be written: %w", d.Journal.Path(), err)
	}
	return nil
}
