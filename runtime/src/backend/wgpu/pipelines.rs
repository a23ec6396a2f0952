//! Compute pipelines, compiled once per device on first use and cached. A
//! shader or pipeline that fails to build is `KernelCompileFailed`.

use std::collections::HashMap;
use std::sync::Arc;

use cistern_kernels::{map, wgsl};

use crate::error::ServerError;
use crate::sync::Mutex;

/// A WGSL module: the prelude and one family's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Module {
    Elementwise,
    /// The activations over `vec4`s.
    ElementwiseVec4,
    /// The element-wise kernels made from their definitions.
    Map,
    /// [`Module::Map`] over `vec4`s.
    MapVec4,
    Gemm,
    Reduce,
    Optimizer,
    /// SGD, Adam, RMSprop and Adagrad over `vec4`s.
    OptimizerVec4,
    Amp,
    Strided,
}

impl Module {
    fn source(self) -> String {
        if let Module::Map | Module::MapVec4 = self {
            let vec4 = self == Module::MapVec4;
            let bindings = if vec4 {
                wgsl::BINDINGS_VEC4
            } else {
                wgsl::BINDINGS
            };
            return [wgsl::PRELUDE, bindings, &map::wgsl_source(vec4)].concat();
        }
        let parts: &[&str] = match self {
            Module::Elementwise => &[wgsl::ACTIVATION, wgsl::ELEMENTWISE],
            Module::ElementwiseVec4 => &[wgsl::ACTIVATION, wgsl::ELEMENTWISE_VEC4],
            Module::Gemm => &[wgsl::ACTIVATION, wgsl::GEMM],
            Module::Reduce => &[
                wgsl::REDUCE,
                wgsl::CLASSIFY,
                wgsl::NORM,
                wgsl::MAX,
                wgsl::ATTENTION,
            ],
            Module::Optimizer => &[wgsl::STEP, wgsl::OPTIMIZER],
            Module::OptimizerVec4 => &[wgsl::STEP, wgsl::OPTIMIZER_VEC4],
            Module::Amp => &[wgsl::AMP],
            Module::Strided => &[wgsl::STRIDED, wgsl::BROADCAST],
            Module::Map | Module::MapVec4 => &[],
        };
        let bindings = match self {
            Module::ElementwiseVec4 => wgsl::BINDINGS_VEC4,
            Module::OptimizerVec4 => wgsl::BINDINGS_VEC4_STEP,
            _ => wgsl::BINDINGS,
        };
        [wgsl::PRELUDE, bindings]
            .into_iter()
            .chain(parts.iter().copied())
            .collect()
    }

    /// The module holding entry point `name`'s vec4 twin, if it has one.
    fn vec4_twin(self, name: &str) -> Option<Module> {
        let (twin, names): (Module, &[&str]) = match self {
            Module::Elementwise => (Module::ElementwiseVec4, &["forward", "backward"]),
            Module::Optimizer => (
                Module::OptimizerVec4,
                &["sgd", "adam", "rmsprop", "adagrad"],
            ),
            // Every element-wise kernel has both forms.
            Module::Map => return Some(Module::MapVec4),
            _ => return None,
        };
        names.contains(&name).then_some(twin)
    }

    /// Whether this module binds buffer `binding` as `f32`s: every binding
    /// of a scalar module, binding 3 (a flag or a step's constants) of the
    /// vec4 steps.
    pub(super) fn binds_f32s(self, binding: u32) -> bool {
        match self {
            Module::ElementwiseVec4 | Module::MapVec4 => false,
            Module::OptimizerVec4 => binding == 3,
            _ => true,
        }
    }
}

/// One entry point and the bindings it uses: the parameters, storage
/// buffers `1..=buffers`, and the u32 table when `table`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Entry {
    pub(super) module: Module,
    pub(super) name: &'static str,
    pub(super) buffers: u32,
    pub(super) table: bool,
    /// Elements one invocation handles: a 1D grid over `n` elements has
    /// `n / (WORKGROUP · per_invocation)` workgroups, rounded up.
    pub(super) per_invocation: u32,
}

impl Entry {
    /// This entry over `vec4`s (same name and bindings, four elements an
    /// item), where its module has that twin.
    pub(super) fn vec4(self) -> Option<Entry> {
        let module = self.module.vec4_twin(self.name)?;
        Some(Entry {
            module,
            per_invocation: 4 * self.per_invocation,
            ..self
        })
    }
}

/// The binding of the u32 table.
pub(super) const TABLE_BINDING: u32 = 7;

/// A built pipeline and the layout of its bind group.
#[derive(Debug)]
pub(super) struct Compiled {
    pub(super) pipeline: ::wgpu::ComputePipeline,
    pub(super) layout: ::wgpu::BindGroupLayout,
}

/// The modules and pipelines built so far.
#[derive(Debug, Default)]
pub(crate) struct Pipelines {
    modules: Mutex<HashMap<Module, ::wgpu::ShaderModule>>,
    built: Mutex<HashMap<Entry, Arc<Compiled>>>,
}

impl Pipelines {
    /// `entry`'s pipeline on `device`, built on first use.
    pub(super) fn get(
        &self,
        device: &::wgpu::Device,
        entry: Entry,
    ) -> Result<Arc<Compiled>, ServerError> {
        if let Some(compiled) = self.built.lock().get(&entry) {
            return Ok(compiled.clone());
        }
        let failed = |message: String| ServerError::KernelCompileFailed {
            kernel: entry.name.to_string(),
            message,
        };
        // Scopes are per thread: this one's own errors land in them.
        let scope = device.push_error_scope(::wgpu::ErrorFilter::Validation);
        let module = self.module(device, entry.module);
        let layout = bind_group_layout(device, entry);
        let pipeline_layout = device.create_pipeline_layout(&::wgpu::PipelineLayoutDescriptor {
            label: Some(entry.name),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&::wgpu::ComputePipelineDescriptor {
            label: Some(entry.name),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some(entry.name),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(error) = pollster::block_on(scope.pop()) {
            // The module may be what failed: build it afresh next time.
            self.modules.lock().remove(&entry.module);
            return Err(failed(error.to_string()));
        }
        let compiled = Arc::new(Compiled { pipeline, layout });
        self.built.lock().insert(entry, compiled.clone());
        Ok(compiled)
    }

    fn module(&self, device: &::wgpu::Device, module: Module) -> ::wgpu::ShaderModule {
        self.modules
            .lock()
            .entry(module)
            .or_insert_with(|| {
                device.create_shader_module(::wgpu::ShaderModuleDescriptor {
                    label: Some("cistern kernels"),
                    source: ::wgpu::ShaderSource::Wgsl(module.source().into()),
                })
            })
            .clone()
    }
}

fn bind_group_layout(device: &::wgpu::Device, entry: Entry) -> ::wgpu::BindGroupLayout {
    let buffer = |binding, ty| ::wgpu::BindGroupLayoutEntry {
        binding,
        visibility: ::wgpu::ShaderStages::COMPUTE,
        ty: ::wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    };
    let storage = ::wgpu::BufferBindingType::Storage { read_only: false };
    let mut entries = vec![buffer(0, ::wgpu::BufferBindingType::Uniform)];
    entries.extend((1..=entry.buffers).map(|binding| buffer(binding, storage)));
    if entry.table {
        entries.push(buffer(TABLE_BINDING, storage));
    }
    device.create_bind_group_layout(&::wgpu::BindGroupLayoutDescriptor {
        label: Some(entry.name),
        entries: &entries,
    })
}
