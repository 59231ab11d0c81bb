package apierr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestTransient(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	refused := &url.Error{Op: "Get", URL: "https://127.0.0.1:6443/api/v1/nodes/n",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"connection refused", refused, true},
		{"connection refused, wrapped twice", fmt.Errorf("evict: %w", fmt.Errorf("pod a: %w", refused)), true},
		{"joined with a drain error", errors.Join(errors.New("drain"), refused), true},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{"io.ErrUnexpectedEOF", fmt.Errorf("decode: %w", errorsUnexpectedEOF()), true},
		{"503", apierrors.NewServiceUnavailable("etcd"), true},
		{"500", apierrors.NewInternalError(errors.New("etcd")), true},
		{"504 server timeout", apierrors.NewServerTimeout(pods, "get", 1), true},
		{"429", apierrors.NewTooManyRequests("slow down", 1), true},
		{"conflict", apierrors.NewConflict(pods, "a", errors.New("modified")), true},
		{"already exists", apierrors.NewAlreadyExists(pods, "a"), false},
		{"forbidden", apierrors.NewForbidden(pods, "a", errors.New("rbac")), false},
		{"unauthorized", apierrors.NewUnauthorized("token"), false},
		{"not found", fmt.Errorf("get: %w", apierrors.NewNotFound(pods, "a")), false},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "a", nil), false},
		{"bad request", apierrors.NewBadRequest("no"), false},
		{"forbidden beats refused", errors.Join(refused, apierrors.NewForbidden(pods, "a", errors.New("rbac"))), false},
		{"canceled", fmt.Errorf("get: %w", context.Canceled), false},
		{"deadline", context.DeadlineExceeded, false},
		{"not an API error", errors.New("pods still on the node after the drain timeout"), false},
	}
	for _, tc := range tests {
		if got := Transient(tc.err); got != tc.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestPermanent(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("list: %w", apierrors.NewForbidden(pods, "", errors.New("rbac"))), true},
		{apierrors.NewNotFound(pods, "a"), true},
		{apierrors.NewServiceUnavailable("etcd"), false},
		{errors.New("client rate limiter Wait returned an error: would exceed context deadline"), false},
		{&url.Error{Op: "Get", URL: "https://x", Err: syscall.ECONNREFUSED}, false},
	} {
		if got := Permanent(tc.err); got != tc.want {
			t.Errorf("Permanent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func errorsUnexpectedEOF() error { return io.ErrUnexpectedEOF }
