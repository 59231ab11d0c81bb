// Package apierr classifies the errors of Kubernetes API calls: which are
// worth a retry of the same request (Transient) and which are an answer no
// retry changes (Permanent). It is the one rule of the agent and of the
// drain package; internal/backoff decides how long to wait, this package
// whether to try again.
package apierr

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"syscall"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// Transient reports whether err is worth a retry of the same request: the
// API server did not answer (connection refused or reset, a connection cut
// mid-answer, a network timeout, any transport error) or answered that it
// cannot serve now (429, 500, 503, 504, a server timeout) or that another
// writer won a race (409 Conflict). Any other answer (403, 401, 404, 400,
// 422, 405, 409 AlreadyExists) and any error that is no API call's (a drain
// timeout, bad input) is not; a cancelled context never is.
//
// It is the one rule of the agent and of the drain package for which errors
// are retried.
func Transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsInvalid(err) ||
		apierrors.IsBadRequest(err) || apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) ||
		apierrors.IsAlreadyExists(err) || apierrors.IsGone(err) {
		return false
	}
	if apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsConflict(err) ||
		apierrors.IsUnexpectedServerError(err) {
		return true
	}
	if code, ok := statusCode(err); ok {
		return code == 502 || code == 503 || code == 504
	}
	var uerr *url.Error
	var nerr net.Error
	return errors.As(err, &uerr) || errors.As(err, &nerr) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err)
}

// Permanent reports whether err is an answer of the API server that no
// retry changes (an API status that is not Transient). A poll stops at
// once on such an answer and goes on through any other error until its own
// deadline (a client-side error such as the rate limiter's near a deadline
// is no answer).
func Permanent(err error) bool {
	_, isStatus := statusCode(err)
	return isStatus && !Transient(err)
}

func statusCode(err error) (int, bool) {
	var s apierrors.APIStatus
	if errors.As(err, &s) {
		return int(s.Status().Code), true
	}
	return 0, false
}
