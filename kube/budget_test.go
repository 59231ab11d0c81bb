package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/clientset"
)

// worstRecord is a record whose every field is over its bound, bounded.
func worstRecord(i int) record.ChangeRecord {
	huge := strings.Repeat("m", 90<<10)
	pods := make([]string, 200)
	for p := range pods {
		pods[p] = fmt.Sprintf("%s/%s-%d", strings.Repeat("n", 63), strings.Repeat("p", 240), p)
	}
	geo := map[string][]string{}
	var unusable []record.UnusableGPU
	for g := range 16 {
		for s := range 7 {
			geo[fmt.Sprint(g)] = append(geo[fmt.Sprint(g)], fmt.Sprintf("1g.18gb@%d", s))
		}
		unusable = append(unusable, record.UnusableGPU{Index: g, Return: huge, Reason: huge})
	}
	now := time.Unix(int64(i), 0)
	return record.ChangeRecord{Config: fmt.Sprintf("c%d-%s", i, huge), PreviousConfig: huge, Result: record.StateFailed, Reason: huge,
		StartedAt: now, FinishedAt: now, DisruptedAt: &now, RequestedAt: &now,
		GPUsChanged: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, GPUsUntouched: []int{},
		EvictedPods: pods, AgentVersion: huge, DriverVersion: huge, ConfigHash: huge, ConfigSource: huge,
		RequestedBy: huge, RequestedVia: huge, RequestedBySource: huge, AffectedBy: huge,
		Geometry: geo, GPUsUnusable: unusable}.Bounded()
}

// Records that always land: the budget is Kubernetes' own limit; a Node
// whose other annotations leave exactly the room record.RecordBudget asks
// for takes a record at its bounds on a full history of such records (and
// on a history that does not parse, set aside), within the API server's
// validation; a byte less and the preflight refuses the change, naming
// the annotation that takes the room, before any dry run is sent.
func TestRecordBudget(t *testing.T) {
	if record.AnnotationBudget != apivalidation.TotalAnnotationSizeLimitB {
		t.Fatalf("record.AnnotationBudget %d, Kubernetes' TotalAnnotationSizeLimitB %d", record.AnnotationBudget, apivalidation.TotalAnnotationSizeLimitB)
	}
	const user = "example.com/big"
	for _, history := range []string{"records", "unparsable"} {
		t.Run(history, func(t *testing.T) {
			ctx := context.Background()
			ann := map[string]string{user: ""}
			if history == "unparsable" {
				ann[record.AnnotationHistory] = strings.Repeat("{", 40<<10)
			}
			need, _, _ := record.RecordBudget(ann)
			ann[user] = strings.Repeat("u", record.AnnotationBudget-need)
			if need, others, fits := record.RecordBudget(ann); !fits || need != record.AnnotationBudget || others != len(user)+len(ann[user]) {
				t.Fatalf("RecordBudget: need %d, others %d, fits %v", need, others, fits)
			}
			c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: ann}})
			k := &Cluster{Client: clientset.Wrap(c), Node: "n1", Clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
			if err := recordBudget(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: ann}}); err != nil {
				t.Fatal(err)
			}
			for i := range record.HistoryMaxRecords + 2 {
				n, err := k.getNode(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := k.RecordRetiring(ctx, n, worstRecord(i), record.StateFailed); err != nil {
					t.Fatal(err)
				}
				n, _ = k.getNode(ctx)
				if err := apivalidation.ValidateAnnotationsSize(n.Annotations); err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
				if err := recordBudget(n); err != nil {
					t.Fatalf("after record %d: %v", i, err)
				}
			}
			// One byte more of the user's: refused, before any write is tried.
			n, _ := k.getNode(ctx)
			n = n.DeepCopy()
			n.Annotations[user] += "u"
			if _, err := c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			c.ClearActions()
			err := k.Preflight(ctx, true)
			if !errors.Is(err, ErrAnnotationBudget) || !strings.Contains(err.Error(), user) || !strings.Contains(err.Error(), "free at least 1 bytes") {
				t.Fatalf("preflight: %v", err)
			}
			for _, a := range c.Actions() {
				if a.GetVerb() != "get" {
					t.Errorf("preflight sent %s %s", a.GetVerb(), a.GetResource().Resource)
				}
			}
		})
	}
}
