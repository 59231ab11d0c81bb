// Package configmap saves a ConfigMap the agent owns: one read-modify-write
// with one conflict rule, for every ConfigMap it writes (the configs and
// GPUs it publishes, its assignment trail, its change history).
package configmap

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/internal/kclient"
)

// FieldManager names the agent in the ConfigMaps' managedFields.
const FieldManager = "mig-agent"

// Attempts is how many times Save writes before it gives up on conflicts.
const Attempts = 3

// ErrConflict: every attempt met another write (409 Conflict on update,
// AlreadyExists on create). Only the agent writes its ConfigMaps, so a
// conflict is an earlier write of its own whose answer was lost.
var ErrConflict = errors.New("ConfigMap changed under every write")

// Save writes the ConfigMap name through cms. build gets the stored
// ConfigMap (a copy it may change; nil when there is none) and returns the
// one to write (nil: nothing to write). known is the ConfigMap as last read
// or written, which spares the first read (nil: read it). A create that
// finds one, or an update that conflicts, reads it again and builds anew,
// up to Attempts writes; then ErrConflict. It returns the ConfigMap as
// written, or as stored when build wrote nothing.
func Save(ctx context.Context, cms kclient.ConfigMaps, name string, known *corev1.ConfigMap,
	build func(stored *corev1.ConfigMap) (*corev1.ConfigMap, error)) (*corev1.ConfigMap, error) {
	stored := known
	for attempt := range Attempts {
		if attempt > 0 || known == nil {
			var err error
			stored, err = cms.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				stored, err = nil, nil
			}
			if err != nil {
				return nil, err
			}
		}
		var base *corev1.ConfigMap
		if stored != nil {
			base = stored.DeepCopy()
		}
		want, err := build(base)
		if err != nil || want == nil {
			return stored, err
		}
		var out *corev1.ConfigMap
		if stored == nil {
			out, err = cms.Create(ctx, want, metav1.CreateOptions{FieldManager: FieldManager})
		} else {
			out, err = cms.Update(ctx, want, metav1.UpdateOptions{FieldManager: FieldManager})
		}
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			continue
		}
		return out, err
	}
	return nil, fmt.Errorf("ConfigMap %s: %w", name, ErrConflict)
}
