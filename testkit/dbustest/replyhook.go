package dbustest

import (
	"sync"

	"github.com/godbus/dbus/v5"
)

// replyHooks runs code right after a stand-in service's reply to one method
// call has been written to the bus. godbus sends an exported method's reply
// after the method returns, so a method cannot do this itself; two public
// godbus hooks make it exact: the outgoing interceptor sees the reply (and
// which call it answers) just before it is sent, and the serial generator is
// told to retire the reply's serial just after it was sent.
//
// The stand-ins use it to close their copy of a UNIX fd once it has been
// passed to the client, and to emit systemd's JobRemoved after the reply to
// StartUnit/StopUnit, in the order real systemd does.
type replyHooks struct {
	mu      sync.Mutex
	next    uint32
	used    map[uint32]bool
	byCall  map[uint32]func() // serial of the incoming call → hook
	byReply map[uint32]func() // serial of our reply → hook
}

func newReplyHooks() *replyHooks {
	return &replyHooks{
		next:    1,
		used:    map[uint32]bool{},
		byCall:  map[uint32]func(){},
		byReply: map[uint32]func(){},
	}
}

// options are the godbus connection options that install the hooks.
func (h *replyHooks) options() []dbus.ConnOption {
	return []dbus.ConnOption{dbus.WithSerialGenerator(h), dbus.WithOutgoingInterceptor(h.outgoing)}
}

// afterReply runs fn once the reply to the call msg has been sent. If the
// reply is never sent (the client went away), fn runs from drain.
func (h *replyHooks) afterReply(msg dbus.Message, fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.byCall[msg.Serial()] = fn
}

// drain runs every hook that has not run yet (at shutdown).
func (h *replyHooks) drain() {
	h.mu.Lock()
	var fns []func()
	for k, fn := range h.byCall {
		fns = append(fns, fn)
		delete(h.byCall, k)
	}
	for k, fn := range h.byReply {
		fns = append(fns, fn)
		delete(h.byReply, k)
	}
	h.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

func (h *replyHooks) outgoing(msg *dbus.Message) {
	if msg.Type != dbus.TypeMethodReply && msg.Type != dbus.TypeError {
		return
	}
	v, ok := msg.Headers[dbus.FieldReplySerial]
	if !ok {
		return
	}
	callSerial, ok := v.Value().(uint32)
	if !ok {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if fn, ok := h.byCall[callSerial]; ok {
		delete(h.byCall, callSerial)
		h.byReply[msg.Serial()] = fn
	}
}

// GetSerial implements dbus.SerialGenerator.
func (h *replyHooks) GetSerial() uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		s := h.next
		h.next++
		if s != 0 && !h.used[s] {
			h.used[s] = true
			return s
		}
	}
}

// RetireSerial implements dbus.SerialGenerator; godbus calls it after it sent
// a reply, error or signal, and after it received the answer to a call.
func (h *replyHooks) RetireSerial(serial uint32) {
	h.mu.Lock()
	delete(h.used, serial)
	fn := h.byReply[serial]
	delete(h.byReply, serial)
	h.mu.Unlock()
	if fn != nil {
		fn()
	}
}
