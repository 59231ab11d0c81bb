package podresources

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
)

// The agent makes one kind of gRPC call, a unary call to the kubelet's
// PodResources API on a unix socket, so it speaks the wire format itself
// instead of linking grpc-go: HTTP/2 with prior knowledge (no TLS) from the
// standard library, gRPC's length-prefixed messages, and the status in the
// trailers. The format is the one of grpc's PROTOCOL-HTTP2.md; grpc-go's
// server (internal/transport/http2_server.go, operateHeaders and
// writeStatus) is what the kubelet runs.

const (
	// podResourcesListMethod is the full method name of List
	// (k8s.io/kubelet pkg/apis/podresources/v1/api_grpc.pb.go).
	podResourcesListMethod = "/v1.PodResourcesLister/List"
	// grpcContentType is the content type of a gRPC request and response.
	grpcContentType = "application/grpc"
	// grpcFrameHeader is a message's prefix: a compressed flag byte and a
	// 4-byte big-endian length.
	grpcFrameHeader = 5
	// grpcStatusOK is gRPC's code OK; codes.go names the others.
	grpcStatusOK = 0
)

// errGRPCStatus is wrapped by a call that the server ended with a status
// other than OK.
var errGRPCStatus = errors.New("gRPC status")

// unaryCall sends req (an encoded protobuf message, nil for an empty one) to
// method on the gRPC server at the unix socket path and returns the response
// message, at most maxMsg bytes.
func unaryCall(ctx context.Context, socket, method string, req []byte, maxMsg int) ([]byte, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
		Protocols: unencryptedHTTP2(),
	}
	defer tr.CloseIdleConnections()
	body := make([]byte, grpcFrameHeader+len(req))
	binary.BigEndian.PutUint32(body[1:], uint32(len(req)))
	copy(body[grpcFrameHeader:], req)
	// The authority is "localhost", as grpc-go sends for a unix target
	// (internal/resolver/unix).
	u := &url.URL{Scheme: "http", Host: "localhost", Path: method}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", grpcContentType)
	// Required by gRPC: the client accepts trailers.
	hreq.Header.Set("Te", "trailers")
	hreq.ContentLength = int64(len(body))
	resp, err := (&http.Client{Transport: tr}).Do(hreq)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP status %d from the gRPC server", resp.StatusCode)
	}
	// A call that fails before any message sends its status in the
	// headers alone ("Trailers-Only").
	if err := grpcStatus(resp.Header); err != nil {
		return nil, err
	}
	msg, rerr := readMessage(resp.Body, maxMsg)
	if rerr != nil {
		return nil, rerr
	}
	// Drain to EOF so that the trailers arrive.
	if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, int64(maxMsg))); err != nil {
		return nil, err
	}
	if resp.Trailer.Get("Grpc-Status") == "" {
		return nil, fmt.Errorf("%w: the response ended without one", errGRPCStatus)
	}
	if err := grpcStatus(resp.Trailer); err != nil {
		return nil, err
	}
	return msg, nil
}

// unencryptedHTTP2 is HTTP/2 with prior knowledge on http:// URLs, as gRPC
// speaks it without TLS.
func unencryptedHTTP2() *http.Protocols {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &p
}

// readMessage reads one length-prefixed message of a unary response.
func readMessage(r io.Reader, maxMsg int) ([]byte, error) {
	var hdr [grpcFrameHeader]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: no message and no status", errGRPCStatus)
		}
		return nil, fmt.Errorf("reading a gRPC message header: %w", err)
	}
	if hdr[0] != 0 {
		// The request advertised no grpc-accept-encoding: the server
		// must not compress.
		return nil, fmt.Errorf("gRPC message compressed (flag %d), never asked for", hdr[0])
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if int64(n) > int64(maxMsg) {
		return nil, fmt.Errorf("gRPC message of %d bytes is over the limit of %d", n, maxMsg)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, fmt.Errorf("reading a gRPC message of %d bytes: %w", n, err)
	}
	return msg, nil
}

// grpcStatus is nil for a status OK or none, else an error with the code
// and the (percent-encoded on the wire) message.
func grpcStatus(h http.Header) error {
	s := h.Get("Grpc-Status")
	if s == "" {
		return nil
	}
	code, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("%w: unreadable grpc-status %q", errGRPCStatus, s)
	}
	if code == grpcStatusOK {
		return nil
	}
	msg := h.Get("Grpc-Message")
	if m, err := url.PathUnescape(msg); err == nil {
		msg = m
	}
	return fmt.Errorf("%w %d (%s): %s", errGRPCStatus, code, grpcCodeName(code), msg)
}

// grpcCodeName names the codes of grpc's codes/codes.go.
func grpcCodeName(code int) string {
	names := [...]string{"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
		"AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
		"OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated"}
	if code >= 0 && code < len(names) {
		return names[code]
	}
	return "code " + strconv.Itoa(code)
}
