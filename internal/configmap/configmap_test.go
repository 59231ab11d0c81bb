package configmap

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/migagent/mig-agent/testkit/clientset"
)

func set(v string) func(*corev1.ConfigMap) (*corev1.ConfigMap, error) {
	return func(cm *corev1.ConfigMap) (*corev1.ConfigMap, error) {
		if cm == nil {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns"}}
		}
		if cm.Data["k"] == v {
			return nil, nil
		}
		cm.Data = map[string]string{"k": v}
		return cm, nil
	}
}

// Save creates a missing ConfigMap, updates a stored one, writes nothing
// when build says so, rebuilds after a conflict and gives up after
// Attempts of them.
func TestSave(t *testing.T) {
	f := fake.NewClientset()
	cms := clientset.Wrap(f).CoreV1().ConfigMaps("ns")
	ctx := context.Background()
	cm, err := Save(ctx, cms, "c", nil, set("1"))
	if err != nil || cm.Data["k"] != "1" {
		t.Fatalf("create: %+v, %v", cm, err)
	}
	if cm, err = Save(ctx, cms, "c", cm, set("2")); err != nil || cm.Data["k"] != "2" {
		t.Fatalf("update: %+v, %v", cm, err)
	}
	writes := 0
	f.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		writes++
		if writes <= 2 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, "c", errors.New("changed"))
		}
		return false, nil, nil
	})
	if cm, err = Save(ctx, cms, "c", cm, set("2")); err != nil || writes != 0 {
		t.Fatalf("unchanged: %d writes, %v", writes, err)
	}
	if cm, err = Save(ctx, cms, "c", cm, set("3")); err != nil || cm.Data["k"] != "3" || writes != 3 {
		t.Fatalf("after 2 conflicts: %+v, %d writes, %v", cm, writes, err)
	}
	writes = -10
	if _, err = Save(ctx, cms, "c", cm, set("4")); !errors.Is(err, ErrConflict) || writes != -10+Attempts {
		t.Fatalf("conflicts only: %d writes, %v", writes+10, err)
	}
}
