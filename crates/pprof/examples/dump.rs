//! Prints a profile the way `go tool pprof -raw` does (roughly): a debugging aid.
//!
//! `cargo run -p fathom-pprof --example dump -- <file>`

use fathom_pprof::{Limits, decode};

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: dump <profile>");
        std::process::exit(2);
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(1);
        }
    };
    let p = match decode(&bytes, &Limits::default()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(1);
        }
    };
    let s = |i: i64| {
        p.string_table
            .get(i as usize)
            .map_or("<bad>", String::as_str)
    };
    for st in &p.sample_type {
        print!("{}/{} ", s(st.r#type), s(st.unit));
    }
    println!();
    if let Some(pt) = &p.period_type {
        println!(
            "PeriodType: {} {} Period: {}",
            s(pt.r#type),
            s(pt.unit),
            p.period
        );
    }
    println!("Samples:");
    for x in &p.sample {
        let labels: Vec<String> = x
            .label
            .iter()
            .map(|l| format!("{}={}/{}", s(l.key), s(l.str), l.num))
            .collect();
        println!("{:?}: {:?} {}", x.value, x.location_id, labels.join(" "));
    }
    println!("Locations:");
    for l in &p.location {
        let lines: Vec<String> = l
            .line
            .iter()
            .map(|ln| {
                let f = p.function.iter().find(|f| f.id == ln.function_id);
                format!("{:?}:{}", f.map_or("??", |f| s(f.name)), ln.line)
            })
            .collect();
        println!(
            "{:>6}: {:#x} M={} {}",
            l.id,
            l.address,
            l.mapping_id,
            lines.join(" | ")
        );
    }
    println!("Mappings:");
    for m in &p.mapping {
        println!(
            "{}: {:#x}/{:#x}/{:#x} {} {}",
            m.id,
            m.memory_start,
            m.memory_limit,
            m.file_offset,
            s(m.filename),
            s(m.build_id)
        );
    }
}
