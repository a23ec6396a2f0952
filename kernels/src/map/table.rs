//! The element-wise kernels' definitions as data, and the WGSL and CUDA C
//! made from them. Self-contained: the build script includes this file to
//! compile the CUDA program without the rest of the crate.

/// What one element-wise kernel's definition says (`map/ops.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapDefinition {
    /// Its stable snake_case name.
    pub name: &'static str,
    /// Its inputs' names, in binding order.
    pub inputs: &'static [&'static str],
    /// Its scalar arguments' names, in order.
    pub scalars: &'static [&'static str],
    /// Whether it writes its first input (else a binding after the inputs).
    pub in_place: bool,
    /// Its value, one expression over the inputs and scalars.
    pub expression: &'static str,
    /// Its WGSL entry point, in the scalar and the vec4 module alike.
    pub wgsl_entry: &'static str,
    /// Its CUDA kernel.
    pub cuda_entry: &'static str,
}

impl MapDefinition {
    /// Its bindings: the inputs, and the output unless it writes in place.
    pub const fn bindings(&self) -> usize {
        self.inputs.len() + if self.in_place { 0 } else { 1 }
    }

    /// The binding it writes (0-based).
    pub const fn written(&self) -> usize {
        if self.in_place { 0 } else { self.inputs.len() }
    }
}

macro_rules! is_in_place {
    (new) => {
        false
    };
    (in_place) => {
        true
    };
}

macro_rules! map_ops {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal
        ($($input:ident),*) [$($scalar:ident),*] $mode:ident : $expr:expr;)*) => {
        /// Every element-wise kernel's definition, in `MapOp` order.
        pub const DEFINITIONS: &[MapDefinition] = &[$(MapDefinition {
            name: $name,
            inputs: &[$(stringify!($input)),*],
            scalars: &[$(stringify!($scalar)),*],
            in_place: is_in_place!($mode),
            expression: stringify!($expr),
            wgsl_entry: concat!("map_", $name),
            cuda_entry: concat!("cistern_map_", $name),
        },)*];
    };
}

include!("ops.rs");

/// Every element-wise kernel's WGSL entry point.
pub fn wgsl_entries() -> impl Iterator<Item = &'static str> {
    DEFINITIONS.iter().map(|definition| definition.wgsl_entry)
}

/// The WGSL of every element-wise kernel, over `f32`s or over `vec4<f32>`s
/// (for a module whose buffers are arrays of vec4s); it follows the prelude
/// and the module's bindings. Binding `j` is buffer `b{j+1}`.
pub fn wgsl_source(vec4: bool) -> String {
    let (element, quad) = if vec4 {
        ("vec4<f32>", " / 4u")
    } else {
        ("f32", "")
    };
    let mut text = String::from("// Element-wise kernels made from kernels/src/map/ops.rs.\n");
    for definition in DEFINITIONS {
        let name = definition.name;
        let params: Vec<String> = (definition.inputs.iter())
            .map(|input| format!("{input}: {element}"))
            .chain(definition.scalars.iter().map(|s| format!("{s}: f32")))
            .collect();
        let expression = definition.expression;
        text.push_str(&format!(
            "fn map_value_{name}({}) -> {element} {{ return {element}({expression}); }}\n",
            params.join(", ")
        ));
        let args: Vec<String> = (1..=definition.inputs.len())
            .map(|binding| format!("b{binding}[base({binding}u){quad} + i]"))
            .chain((0..definition.scalars.len()).map(|s| format!("pf({s}u)")))
            .collect();
        let out = definition.written() + 1;
        text.push_str(&format!(
            "@compute @workgroup_size(256)\n\
             fn {entry}(@builtin(workgroup_id) wid: vec3<u32>, \
             @builtin(local_invocation_id) lid: vec3<u32>, \
             @builtin(num_workgroups) groups: vec3<u32>) {{\n    \
                 let n = count(){quad};\n    \
                 for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {{\n        \
                     let i = streaming(wid, lid, groups, k);\n        \
                     if (i >= n) {{ return; }}\n        \
                     b{out}[base({out}u){quad} + i] = map_value_{name}({args});\n    \
                 }}\n\
             }}\n",
            entry = definition.wgsl_entry,
            args = args.join(", "),
        ));
    }
    text
}

/// Every element-wise kernel's CUDA kernel.
pub fn cuda_entries() -> impl Iterator<Item = &'static str> {
    DEFINITIONS.iter().map(|definition| definition.cuda_entry)
}

/// The functions an expression may call, for CUDA: the `f32` forms, in the
/// namespace the values are defined in, so they hide the `double` ones.
const CUDA_VOCABULARY: &str = "\
__device__ __forceinline__ float exp(float x) { return expf(x); }
__device__ __forceinline__ float log(float x) { return logf(x); }
__device__ __forceinline__ float tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ float abs(float x) { return fabsf(x); }
__device__ __forceinline__ float max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ float min(float a, float b) { return fminf(a, b); }
";

/// The CUDA C of every element-wise kernel (after the prelude): its
/// parameters are its bindings in order, its scalars, then the length; the
/// bulk goes through `float4` loads where every pointer allows.
pub fn cuda_source() -> String {
    let mut values = String::new();
    let mut kernels = String::new();
    for definition in DEFINITIONS {
        let name = definition.name;
        let params: Vec<String> = (definition.inputs.iter())
            .chain(definition.scalars)
            .map(|name| format!("float {name}"))
            .collect();
        values.push_str(&format!(
            "__device__ __forceinline__ float value_{name}({}) {{ return {}; }}\n",
            params.join(", "),
            definition.expression
        ));
        let written = definition.written();
        let pointers: Vec<String> = (0..definition.bindings())
            .map(|binding| {
                let constness = if binding == written { "" } else { "const " };
                format!("{constness}float* p{binding}")
            })
            .chain((0..definition.scalars.len()).map(|s| format!("float s{s}")))
            .chain(["u64 n".to_string()])
            .collect();
        let call = |at: &str| {
            let args: Vec<String> = (0..definition.inputs.len())
                .map(|input| at.replace('#', &input.to_string()))
                .chain((0..definition.scalars.len()).map(|s| format!("s{s}")))
                .collect();
            format!("cistern_map::value_{name}({})", args.join(", "))
        };
        let aligned: Vec<String> = (0..definition.bindings())
            .map(|binding| format!("cistern_aligned16(p{binding})"))
            .collect();
        let loads: String = (0..definition.inputs.len())
            .map(|input| {
                format!(
                    "            float4 v{input} = reinterpret_cast<const float4*>(p{input})[q];\n"
                )
            })
            .collect();
        let lanes: String = ["x", "y", "z", "w"]
            .iter()
            .map(|lane| format!(" r.{lane} = {};", call(&format!("v#.{lane}"))))
            .collect();
        kernels.push_str(&format!(
            "extern \"C\" __global__ void {entry}({params}) {{\n    \
                 if ({aligned}) {{\n        \
                     u64 quads = n / 4;\n        \
                     CISTERN_GRID_STRIDE(q, quads) {{\n{loads}            \
                         float4 r;{lanes}\n            \
                         reinterpret_cast<float4*>(p{written})[q] = r;\n        \
                     }}\n        \
                     CISTERN_GRID_STRIDE(t, n - quads * 4) {{\n            \
                         u64 i = quads * 4 + t;\n            \
                         p{written}[i] = {scalar};\n        \
                     }}\n    \
                 }} else {{\n        \
                     CISTERN_GRID_STRIDE(i, n) {{ p{written}[i] = {scalar}; }}\n    \
                 }}\n\
             }}\n",
            entry = definition.cuda_entry,
            params = pointers.join(", "),
            aligned = aligned.join(" && "),
            scalar = call("p#[i]"),
        ));
    }
    format!(
        "// Element-wise kernels made from kernels/src/map/ops.rs.\n\
         namespace cistern_map {{\n{CUDA_VOCABULARY}{values}}}\n{kernels}"
    )
}
