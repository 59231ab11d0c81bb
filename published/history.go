package published

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/record"
)

// RecordKey names a record in both histories, the Node's and the
// ConfigMap's, whole or light: when it started and finished, its config
// and its result. The agent keys the records its history ConfigMap holds
// by it; `mig-agent status` matches a light record to its whole form by
// it.
func RecordKey(r record.ChangeRecord) string {
	return r.StartedAt.UTC().Format(time.RFC3339Nano) + " " + r.FinishedAt.UTC().Format(time.RFC3339Nano) + " " + r.Config + " " + r.Result
}

// ReadHistory reads node's whole history from its ConfigMap in namespace
// (record.HistoryConfigMapName), newest first (`mig-agent status`, the
// assignment trail); found is false where there is no such ConfigMap. Entries that are not valid records
// are left out and reported in bad.
func ReadHistory(ctx context.Context, client kclient.Interface, namespace, node string) (recs []record.ChangeRecord, bad []record.BadEntry, found bool, err error) {
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, record.HistoryConfigMapName(node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil, false, nil
	}
	if err != nil {
		return nil, nil, false, err
	}
	recs, bad, err = record.DecodeHistory(cm.Data[record.HistoryConfigMapKey])
	if err != nil {
		return nil, nil, true, fmt.Errorf("ConfigMap %s/%s, key %s: %w", namespace, cm.Name, record.HistoryConfigMapKey, err)
	}
	return recs, bad, true, nil
}
