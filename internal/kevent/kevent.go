// Package kevent posts Kubernetes Events: the one place where the agent
// (its Node's Events and its preflight), the assignment trail (its pods'
// MigDeviceAssigned) and the planner (its pending pods' Events) create
// them, with one naming rule and one bound on the message.
package kevent

import (
	"context"
	"time"

	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/record"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// MaxMessage is the most bytes of an Event's message; a longer one is cut
// (record.Truncate).
const MaxMessage = 1024

// Poster is who posts: its client and the Event's source.
type Poster struct {
	Client kclient.Interface
	// Component and Host are the Event's source (Host: empty for a
	// component that runs on no one node, as the planner).
	Component, Host string
	// Controller and Instance are its reportingController and
	// reportingInstance.
	Controller, Instance string
}

// NodeRef is the reference of the Node name with uid.
func NodeRef(name, uid string) corev1.ObjectReference {
	return corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: name, UID: types.UID(uid)}
}

// PodRef is the reference of the pod namespace/name with uid.
func PodRef(namespace, name, uid string) corev1.ObjectReference {
	return corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: namespace, Name: name, UID: types.UID(uid)}
}

// Post creates one Event about ref at now: in ref's namespace (the
// default namespace for a Node), named by the API server after ref
// (generateName "<name>."), its message cut at MaxMessage. With dryRun the
// API server checks the request and stores nothing. The error is the API
// call's; callers log it, an Event is never worth failing for.
func (p Poster) Post(ctx context.Context, now time.Time, ref corev1.ObjectReference, typ, reason, msg string, dryRun bool) error {
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	t := metav1.NewTime(now)
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: ref.Name + ".", Namespace: ns},
		InvolvedObject: ref,
		Reason:         reason, Message: record.Truncate(msg, MaxMessage), Type: typ,
		Source:         corev1.EventSource{Component: p.Component, Host: p.Host},
		FirstTimestamp: t, LastTimestamp: t, Count: 1,
		ReportingController: p.Controller, ReportingInstance: p.Instance,
	}
	var opts metav1.CreateOptions
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err := p.Client.CoreV1().Events(ns).Create(ctx, ev, opts)
	return err
}
