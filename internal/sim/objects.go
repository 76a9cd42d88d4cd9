package sim

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Readers of unstructured fields. A missing field or one of another type
// reads as the zero value: a status field appears only once written.

func str(obj map[string]any, fields ...string) string {
	v, _, _ := unstructured.NestedFieldNoCopy(obj, fields...)
	s, _ := v.(string)
	return s
}

func integer(obj map[string]any, fields ...string) (int64, bool) {
	v, found, _ := unstructured.NestedFieldNoCopy(obj, fields...)
	if !found {
		return 0, false
	}
	switch n := v.(type) {
	case int64:
		return n, true
	case int:
		return int64(n), true
	case float64:
		return int64(n), true
	}
	return 0, false
}

func flag(obj map[string]any, fields ...string) bool {
	v, _, _ := unstructured.NestedFieldNoCopy(obj, fields...)
	b, _ := v.(bool)
	return b
}

func object(obj map[string]any, fields ...string) map[string]any {
	v, _, _ := unstructured.NestedFieldNoCopy(obj, fields...)
	m, _ := v.(map[string]any)
	return m
}

func has(obj map[string]any, fields ...string) bool {
	_, found, _ := unstructured.NestedFieldNoCopy(obj, fields...)
	return found
}

// set writes value at fields, creating the maps on the way. Unlike
// unstructured.SetNestedField it does not copy value; normalize the object
// before it is copied or sent.
func set(obj map[string]any, value any, fields ...string) {
	m := obj
	for _, f := range fields[:len(fields)-1] {
		next, ok := m[f].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[f] = next
		}
		m = next
	}
	m[fields[len(fields)-1]] = value
}

func unset(obj map[string]any, fields ...string) {
	unstructured.RemoveNestedField(obj, fields...)
}

// normalize turns any JSON-able value into the types unstructured objects
// hold (int64, float64, []any, map[string]any), so that it can be compared
// with what the API server returned, and deep-copied.
func normalize(v any) any {
	data, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("sim: value does not marshal to JSON: %v", err))
	}
	var out any
	if err := utiljson.Unmarshal(data, &out); err != nil {
		panic(fmt.Sprintf("sim: JSON does not unmarshal: %v", err))
	}
	return out
}

func sameJSON(a, b any) bool { return reflect.DeepEqual(normalize(a), normalize(b)) }

// controllerRef returns the owner reference of obj marked controller.
func controllerRef(obj *unstructured.Unstructured) *metav1.OwnerReference {
	for _, r := range obj.GetOwnerReferences() {
		if ptr.Deref(r.Controller, false) {
			return &r
		}
	}
	return nil
}

// ownerRef is a reference to owner, as Cluster API sets it.
func ownerRef(owner *unstructured.Unstructured, controller bool) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         owner.GetAPIVersion(),
		Kind:               owner.GetKind(),
		Name:               owner.GetName(),
		UID:                owner.GetUID(),
		Controller:         ptr.To(controller),
		BlockOwnerDeletion: ptr.To(controller),
	}
}

func hasOwner(obj, owner *unstructured.Unstructured) bool {
	for _, r := range obj.GetOwnerReferences() {
		if r.UID == owner.GetUID() {
			return true
		}
	}
	return false
}

func newObject(gvk schema.GroupVersionKind, ns, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// childName is the name of an object that owner creates as its n-th
// child: the owner's name and five characters that look like the random
// suffix Cluster API uses, derived from the owner's UID and n so that a
// repeated pass picks the same name and cannot create a child twice.
func childName(owner *unstructured.Unstructured, n int) string {
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	sum := sha256.Sum256([]byte(string(owner.GetUID()) + "/" + strconv.Itoa(n)))
	suffix := make([]byte, 5)
	for i := range suffix {
		suffix[i] = alphabet[int(sum[i])%len(alphabet)]
	}
	name := owner.GetName()
	if len(name) > 63-6 {
		name = name[:63-6]
	}
	return name + "-" + string(suffix)
}

// freeChildName returns the first childName of owner that no object of
// the kinds given holds and that the simulator has not handed out before:
// a replacement machine gets a new name, as in Cluster API.
func (p *pass) freeChildName(owner *unstructured.Unstructured, kinds ...schema.GroupVersionKind) string {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	for n := 0; ; n++ {
		name := childName(owner, n)
		free := !p.s.named[p.ns+"/"+name]
		for _, k := range kinds {
			if p.w.get(k, name) != nil {
				free = false
			}
		}
		if free {
			p.s.named[p.ns+"/"+name] = true
			return name
		}
	}
}

// Writes. Each one updates the pass's world with what the API server
// returned, so that later steps of the pass see it.

// updateStatus writes next's status through the status subresource when
// it differs from orig's. It reports whether it wrote.
func (p *pass) updateStatus(controller string, orig, next *unstructured.Unstructured) (bool, error) {
	status := normalize(next.Object["status"])
	if reflect.DeepEqual(normalize(orig.Object["status"]), status) {
		return false, nil
	}
	next.Object["status"] = status
	p.writes = append(p.writes, "status "+next.GetKind()+"/"+next.GetName())
	if err := p.s.client.Status().Update(p.ctx, next, client.FieldOwner(fieldManager(controller))); err != nil {
		return false, fmt.Errorf("update status of %s %s/%s: %w", next.GetKind(), next.GetNamespace(), next.GetName(), err)
	}
	next.SetGroupVersionKind(orig.GroupVersionKind())
	p.w.put(next)
	return true, nil
}

// update writes next (spec and metadata) when it differs from orig. Only
// for objects the simulator created: a user's spec is never updated.
func (p *pass) update(controller string, orig, next *unstructured.Unstructured) (bool, error) {
	if sameJSON(orig.Object, next.Object) {
		return false, nil
	}
	next.Object = normalize(next.Object).(map[string]any)
	p.writes = append(p.writes, "update "+next.GetKind()+"/"+next.GetName())
	if err := p.s.client.Update(p.ctx, next, client.FieldOwner(fieldManager(controller))); err != nil {
		return false, fmt.Errorf("update %s %s/%s: %w", next.GetKind(), next.GetNamespace(), next.GetName(), err)
	}
	next.SetGroupVersionKind(orig.GroupVersionKind())
	p.w.put(next)
	return true, nil
}

// apply server-side applies the fields in obj under the controller's
// field manager, without forcing: a field a user set stays theirs.
func (p *pass) apply(controller string, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	obj.Object = normalize(obj.Object).(map[string]any)
	p.writes = append(p.writes, "apply "+obj.GetKind()+"/"+obj.GetName())
	err := p.s.client.Apply(p.ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(fieldManager(controller)))
	if err != nil {
		return fmt.Errorf("apply %s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	// The client decodes the applied object, as the API server returned it,
	// into obj.
	obj.SetGroupVersionKind(gvk)
	p.w.put(obj)
	return nil
}

// create creates obj; an object of that name already there is taken as
// created by an earlier pass.
func (p *pass) create(controller string, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	obj.Object = normalize(obj.Object).(map[string]any)
	err := p.s.client.Create(p.ctx, obj, client.FieldOwner(fieldManager(controller)))
	if apierrors.IsAlreadyExists(err) {
		err = p.s.client.Get(p.ctx, client.ObjectKeyFromObject(obj), obj)
	}
	if err != nil {
		return fmt.Errorf("create %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
	}
	obj.SetGroupVersionKind(gvk)
	p.w.put(obj)
	return nil
}

// remove deletes obj if it is still the object the pass saw.
func (p *pass) remove(obj *unstructured.Unstructured) error {
	err := p.s.client.Delete(p.ctx, obj, client.Preconditions{UID: ptr.To(obj.GetUID())})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete %s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	p.w.remove(obj)
	return nil
}
