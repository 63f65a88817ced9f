// Flame graph trees (the API's flamegraph JSON) flattened into parallel
// arrays in depth-first order, so drawing, searching and hit-testing are
// loops over arrays instead of walks over objects; plus the sandwich view's
// callers and callees trees.

/**
 * Flattens `root` ({name, value, self, children} or, for a diff,
 * {name, left, right, self_left, self_right, children}). Node i spans
 * [start[i], start[i] + value[i]) in the root's value units, sits at
 * depth[i], and its descendants are the indices i+1 .. end[i]-1.
 */
export function flatten(root, diff = false) {
  const f = {
    diff,
    name: [], depth: [], start: [], value: [], self: [], parent: [], end: [],
    left: [], right: [], selfLeft: [], selfRight: [],
    maxDepth: 0,
  };
  const width = (n) => (diff ? n.left + n.right : n.value);
  const stack = [[root, 0, 0, -1]];
  while (stack.length) {
    const [n, d, s, p] = stack.pop();
    f.name.push(n.name);
    f.depth.push(d);
    f.start.push(s);
    f.parent.push(p);
    f.value.push(width(n));
    if (diff) {
      f.left.push(n.left);
      f.right.push(n.right);
      f.selfLeft.push(n.self_left);
      f.selfRight.push(n.self_right);
      f.self.push(n.self_left + n.self_right);
    } else {
      f.self.push(n.self);
    }
    if (d > f.maxDepth) f.maxDepth = d;
    const i = f.name.length - 1;
    const kids = n.children || [];
    const starts = [];
    let off = s;
    for (const c of kids) {
      starts.push(off);
      off += width(c);
    }
    // Reverse, so that children are visited (and numbered) in order.
    for (let k = kids.length - 1; k >= 0; k--) stack.push([kids[k], d + 1, starts[k], i]);
  }
  // end[i]: the first index after i's subtree (preorder: the next node no
  // deeper than i).
  const n = f.name.length;
  f.end = new Array(n).fill(n);
  const open = [];
  for (let i = 0; i < n; i++) {
    while (open.length && f.depth[open[open.length - 1]] >= f.depth[i]) f.end[open.pop()] = i;
    open.push(i);
  }
  return f;
}

/** The frames from the root's child down to node i, joined by ";". */
export function pathOf(f, i) {
  const names = [];
  for (let j = i; j > 0; j = f.parent[j]) names.push(f.name[j]);
  return names.reverse().join(";");
}

/** The node at `path` (as pathOf writes it), or 0 (the root) when absent. */
export function findPath(f, path) {
  if (!path) return 0;
  let cur = 0;
  for (const name of path.split(";")) {
    let next = -1;
    for (let c = cur + 1; c < f.end[cur]; c = f.end[c]) {
      if (f.name[c] === name) {
        next = c;
        break;
      }
    }
    if (next < 0) return cur;
    cur = next;
  }
  return cur;
}

/** The widest node named `name`, or -1. */
export function widest(f, name) {
  let best = -1;
  for (let i = 0; i < f.name.length; i++) {
    if (f.name[i] === name && (best < 0 || f.value[i] > f.value[best])) best = i;
  }
  return best;
}

/** A matcher for the search box: a case-insensitive regex, or the text
 * itself when it is not a valid regex. */
export function matcher(search) {
  if (!search) return null;
  try {
    const re = new RegExp(search, "i");
    return (s) => re.test(s);
  } catch {
    const low = search.toLowerCase();
    return (s) => s.toLowerCase().includes(low);
  }
}

/** Marks the nodes whose name matches; returns (marks, total of the
 * outermost matches: a match under a match is not counted twice). */
export function search(f, match) {
  const n = f.name.length;
  const marks = new Uint8Array(n);
  let total = 0;
  for (let i = 0; i < n; ) {
    if (i > 0 && match(f.name[i])) {
      total += f.value[i];
      for (let j = i; j < f.end[i]; j++) marks[j] = match(f.name[j]) ? 1 : 0;
      i = f.end[i];
    } else {
      i++;
    }
  }
  return { marks, total };
}

/** Adds a chain of names with value v (and self at its end) into a tree. */
function addChain(tree, names, v, selfAtEnd) {
  let cur = tree;
  cur.value += v;
  for (const name of names) {
    let c = cur.kids.get(name);
    if (!c) {
      c = { name, value: 0, self: 0, kids: new Map() };
      cur.kids.set(name, c);
    }
    c.value += v;
    cur = c;
  }
  cur.self += selfAtEnd;
}

function toJson(t) {
  const children = [...t.kids.values()].sort((a, b) => (a.name < b.name ? -1 : 1)).map(toJson);
  return { name: t.name, value: t.value, self: t.self, children };
}

/**
 * The sandwich of function `name`: `callees` (every outermost occurrence's
 * subtree merged, rooted at the function) and `callers` (the inverted
 * stacks leading to it, rooted at the function, callers as children).
 */
export function sandwich(f, name) {
  const callees = { name, value: 0, self: 0, kids: new Map() };
  const callers = { name, value: 0, self: 0, kids: new Map() };
  for (let i = 1; i < f.name.length; ) {
    if (f.name[i] !== name) {
      i++;
      continue;
    }
    const v = f.value[i];
    callees.value += v;
    callees.self += f.self[i];
    // The subtree below i, as chains relative to i.
    const chain = [];
    for (let j = i + 1; j < f.end[i]; j++) {
      chain.length = f.depth[j] - f.depth[i] - 1;
      chain.push(f.name[j]);
      addChain(callees, chain, 0, f.self[j]);
      // addChain added 0 along the way; add j's own value on its node only.
      let c = callees;
      for (const n of chain) c = c.kids.get(n);
      c.value += f.value[j];
    }
    const up = [];
    for (let p = f.parent[i]; p > 0; p = f.parent[p]) up.push(f.name[p]);
    addChain(callers, up, v, v);
    i = f.end[i];
  }
  return { callees: toJson(callees), callers: toJson(callers) };
}
