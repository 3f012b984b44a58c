// Layer norm and group norm on CUDA: the layouts of plan.h (GroupLayout), planned by
// plan_affine_forward / plan_affine_backward and launched here, one switch over the plan
// per direction. The kernels of layer norm's layout are affine_rows.cuh, those of group
// norm's (element-wise passes, pipeline phases, groups in shared memory or a cluster)
// affine_groups.cuh.
//   forward:  y = (x - mean) * rstd * weight + bias
//   backward: grad_x = rstd * (w * dy - mean(w * dy) - xhat * mean(w * dy * xhat)) per row,
//             grad_weight = sum(dy * xhat), grad_bias = sum(dy) per channel.
// Statistics are two-pass or Welford, so they stay accurate when |mean| >> std. Parameter
// gradients are reduced in a fixed order: deterministic for a given device. RMS norm is layer
// norm's layout with no mean (a null pointer): mean 0, rstd = 1 / sqrt(mean(x * x) + eps)
// (Welford's variance plus its squared mean), and no mean(w * dy) term backward.
#include "kernels/cuda/norms/affine_groups.cuh"
#include "kernels/cuda/norms/affine_rows.cuh"
#include "kernels/cuda/norms/norms.cuh"

namespace normcore {
namespace cuda {
namespace {

// ---------------------------------------------------------------- launchers
bool aligned_or_null(const void* p) { return p == nullptr || is_aligned(p, 16); }

// The device's limits for the plans, less clusters where the cluster kernels were not built
// for it (CMAKE_CUDA_ARCHITECTURES without sm_90 or later: their bodies are empty). Only
// layouts with groups can take them, so layer norm's rows skip the query.
template <class T>
DeviceLimits plan_limits(const Launcher& launch, const GroupLayout& l) {
  if (l.is_rows()) return launch.limits();
  return cluster_limits(launch, group_norm_cluster_forward<T, 16 / sizeof(T), kClusterThreads>);
}

// Calls f(std::integral_constant<int, team>{}, std::integral_constant<int, vectors>{}) for
// a Rows plan: teams of 32 to 1024 threads holding 3 or 4 vectors each.
template <class F>
void with_row_team(const AffinePlan& plan, F&& f) {
  auto with_vectors = [&](auto team) {
    if (plan.vector == 3) return f(team, std::integral_constant<int, 3>{});
    return f(team, std::integral_constant<int, kRowVecs>{});
  };
  switch (plan.team) {
    case 32: return with_vectors(std::integral_constant<int, 32>{});
    case 64: return with_vectors(std::integral_constant<int, 64>{});
    case 128: return with_vectors(std::integral_constant<int, 128>{});
    case 256: return with_vectors(std::integral_constant<int, 256>{});
    case 512: return with_vectors(std::integral_constant<int, 512>{});
    default: return with_vectors(std::integral_constant<int, 1024>{});
  }
}

// Calls f(std::integral_constant<int, V>{}) with the plan's column vector: 16 bytes of T, or 1.
template <class T, class F>
void with_vector(int vector, F&& f) {
  if (vector == 1) return f(std::integral_constant<int, 1>{});
  return f(std::integral_constant<int, 16 / static_cast<int>(sizeof(T))>{});
}

// Calls f(std::integral_constant<int, V>{}) for a SharedGroups or ClusterGroups plan's
// vector: V elements of 4, 8 or 16 bytes.
template <class T, class F>
void with_group_vector(const AffinePlan& plan, F&& f) {
  const int bytes = plan.vector * static_cast<int>(sizeof(T));
  if constexpr (sizeof(T) <= 4) {
    if (bytes == 4) return f(std::integral_constant<int, 4 / sizeof(T)>{});
  }
  if (bytes == 8) return f(std::integral_constant<int, 8 / sizeof(T)>{});
  return f(std::integral_constant<int, 16 / sizeof(T)>{});
}

// Calls f(std::integral_constant<int, V>{}, std::integral_constant<int, threads>{}) for a
// SharedGroups plan: with_group_vector's V, blocks of 256 or 1024 threads.
template <class T, class F>
void with_shared_group(const AffinePlan& plan, F&& f) {
  with_group_vector<T>(plan, [&](auto vec) {
    if (plan.team == 1024) return f(vec, std::integral_constant<int, 1024>{});
    return f(vec, std::integral_constant<int, 256>{});
  });
}

// grad_weight[c] = sum over samples of rstd * sum(dy * (x - mean)) over the plane, grad_bias[c]
// = sum(dy), from per-plane sums, in sample order.
template <class T, class A>
void param_grads_from_planes(const Launcher& launch, const GroupLayout& l, const Sums<A, 2>* plane_sums, const A* rstd,
                             T* grad_weight, T* grad_bias) {
  if (!grad_weight && !grad_bias) return;
  const int64_t batch = l.batch, groups = l.groups, group_channels = l.group_channels, channels = l.channels();
  for_each_index(launch, channels, [=] __device__(int64_t c) {
    const int64_t group = c / group_channels;
    A sum_w = 0, sum_b = 0;
    for (int64_t n = 0; n < batch; ++n) {
      const Sums<A, 2>& s = plane_sums[n * channels + c];
      sum_w += s.v[1] * rstd[n * groups + group];
      sum_b += s.v[0];
    }
    if (grad_weight) grad_weight[c] = convert<T>(sum_w);
    if (grad_bias) grad_bias[c] = convert<T>(sum_b);
  });
}

// Row statistics (mean, rstd) through the chunked reduction.
template <class T, class A>
void row_statistics(const Launcher& launch, const GroupLayout& l, const T* x, A eps, A* mean, A* rstd) {
  const int64_t row_len = l.row_len();
  reduce_rows<Welford<A>>(
      launch, l.rows(), row_len, [=] __device__(int64_t row, int64_t i) { return load<T, A>(x, row * row_len + i); },
      [=] __device__(int64_t row, const Welford<A>& w) { finish_statistics(row, w, eps, mean, rstd); });
}

template <class T>
void affine_forward(const char* op, const Tensor& x_t, const Tensor& weight_t, const Tensor& bias_t,
                    const GroupLayout& l, double eps, const Tensor& y_t, const Tensor& mean_t, const Tensor& rstd_t) {
  using A = compute_t<T>;
  const Launcher launch(op, x_t);
  const T* x = data_as<const T>(x_t);
  const T* weight = data_or_null<const T>(weight_t);
  const T* bias = data_or_null<const T>(bias_t);
  T* y = data_as<T>(y_t);
  A* mean = data_or_null<A>(mean_t);  // none: RMS norm
  A* rstd = data_as<A>(rstd_t);
  const int64_t rows = l.rows(), row_len = l.row_len();
  const A eps_a = static_cast<A>(eps);
  const AffinePlan plan =
      plan_affine_forward(l, sizeof(T), is_aligned(x, 16) && is_aligned(y, 16),
                          aligned_or_null(weight) && aligned_or_null(bias), plan_limits<T>(launch, l));
  switch (plan.path) {
    case AffinePath::Rows:
      return with_row_team(plan, [&](auto team, auto vectors) {
        constexpr int kTeam = decltype(team)::value, kVecs = decltype(vectors)::value, V = 16 / sizeof(T);
        constexpr int threads = team_block<kTeam>();
        auto kernel = layer_norm_rows_forward<T, kTeam, V, kVecs>;
        launch(kernel, launch.resident_grid(kernel, threads, 0, ceil_div(rows, threads / kTeam)), threads, 0, rows,
               row_len, x, weight, bias, eps_a, y, mean, rstd);
      });
    case AffinePath::Columns:
      row_statistics(launch, l, x, eps_a, mean, rstd);
      if (rows == 0 || row_len == 0) return;
      return with_vector<T>(plan.vector, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        const ColumnGrid g = column_grid_for(rows, row_len / V, launch.multiprocessors());
        launch(layer_norm_columns_forward<T, V>, g.grid, kThreads, 0, rows, row_len, g.rows_per_slice, x, weight, bias,
               mean, rstd, y);
      });
    case AffinePath::SharedGroups:
      return with_shared_group<T>(plan, [&](auto vec, auto block) {
        constexpr int V = decltype(vec)::value, threads = decltype(block)::value;
        // Two tiles where an SM still holds as many blocks as its threads allow (2048).
        const auto row_bytes = static_cast<size_t>(row_len) * sizeof(T);
        const size_t blocks_per_sm = 2048 / threads;
        const int buffers =
            blocks_per_sm * (2 * row_bytes + 1024) <= static_cast<size_t>(launch.shared_memory_per_block()) ? 2 : 1;
        const size_t bytes = row_bytes * buffers;
        auto kernel = group_norm_shared_forward<T, V, threads>;
        launch.allow_shared_memory(kernel, bytes);
        launch(kernel, launch.resident_grid(kernel, threads, bytes, rows), threads, bytes, rows, row_len, l.groups,
               l.group_channels, l.spatial, buffers, x, weight, bias, eps_a, y, mean, rstd);
      });
    case AffinePath::ClusterGroups:
      return with_group_vector<T>(plan, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        const int64_t slice_vecs = ceil_div(row_len / V, plan.cluster);
        const auto bytes = static_cast<size_t>(slice_vecs * V) * sizeof(T);
        auto kernel = group_norm_cluster_forward<T, V, kClusterThreads>;
        launch.allow_shared_memory(kernel, bytes);
        launch.clusters(kernel, static_cast<unsigned>(rows * plan.cluster), kClusterThreads, bytes, plan.cluster,
                        row_len, l.groups, l.group_channels, l.spatial, x, weight, bias, eps_a, y, mean, rstd);
      });
    case AffinePath::Pipeline: {
      const PipelineShape s = plan_pipeline(rows, row_len, l.spatial == 1 ? row_len : l.spatial, sizeof(T), 1);
      const DeviceBuffer partials = launch.buffer(static_cast<size_t>(s.items) * sizeof(Welford<A>));
      run_pipeline<1, T, Welford<A>, RowInfo<A, 2>>(
          launch, s, x, static_cast<const T*>(nullptr), y, partials.as<Welford<A>>(), StatsReduce<A>{},
          StatsFinish<A>{mean, rstd, eps_a},
          AffineApplyPhase<T, A>{weight, bias, l.groups, l.group_channels, l.spatial});
      return;
    }
    case AffinePath::Elementwise:
      row_statistics(launch, l, x, eps_a, mean, rstd);
      return with_index_type(x_t.numel(), [&](auto index_tag) {
        using Index = decltype(index_tag);
        for_each_index<Index>(launch, x_t.numel(),
                              AffineApply<Index, T, A>{ElementPlace<Index>(l), x, weight, bias, mean, rstd, y});
      });
  }
}

// grad_weight and grad_bias of a layout with one channel per column (spatial == 1).
template <class T, class A>
void column_param_grads(const Launcher& launch, const GroupLayout& l, const T* grad_y, const T* x, const A* mean,
                        const A* rstd, T* grad_weight, T* grad_bias) {
  if (!grad_weight && !grad_bias) return;
  const int64_t batch = l.batch, channels = l.channels();
  const int64_t column_tiles = ceil_div(channels, kColumnTile);
  const int64_t target_blocks = 4 * static_cast<int64_t>(launch.multiprocessors());
  int64_t slices =
      std::max<int64_t>(1, std::min<int64_t>(ceil_div(target_blocks, column_tiles), ceil_div(batch, kColumnRows)));
  slices = std::min<int64_t>(slices, 65535);
  const int64_t rows_per_slice = std::max<int64_t>(1, ceil_div(batch, slices));
  slices = std::max<int64_t>(1, ceil_div(batch, rows_per_slice));
  const DeviceBuffer partial_w = launch.buffer(static_cast<size_t>(slices * channels) * sizeof(A));
  const DeviceBuffer partial_b = launch.buffer(static_cast<size_t>(slices * channels) * sizeof(A));
  if (channels > 0) {
    const dim3 grid(static_cast<unsigned>(column_tiles), static_cast<unsigned>(slices));
    launch(column_grads_kernel<T, A>, grid, kThreads, 0, grad_y, x, mean, rstd, batch, channels, l.groups,
           l.group_channels, rows_per_slice, partial_w.as<A>(), partial_b.as<A>());
  }
  sum_slices(launch, partial_w.as<const A>(), partial_b.as<const A>(), slices, channels, grad_weight, grad_bias);
}

// coef[row] = {mean(w * dy), mean(w * dy * xhat)} through the chunked reduction (spatial == 1).
template <class T, class A>
void row_coefficients(const Launcher& launch, const GroupLayout& l, const T* grad_y, const T* x, const T* weight,
                      const A* mean, const A* rstd, A* coef) {
  const int64_t row_len = l.row_len(), groups = l.groups, group_channels = l.group_channels;
  const A inv_len = row_len > 0 ? A(1) / static_cast<A>(row_len) : A(0);
  reduce_rows<Sums<A, 2>>(
      launch, l.rows(), row_len,
      [=] __device__(int64_t row, int64_t i) {
        const int64_t e = row * row_len + i;
        const A w = weight ? load<T, A>(weight, (row % groups) * group_channels + i) : A(1);
        const A g = w * load<T, A>(grad_y, e);
        return Sums<A, 2>{{g, g * (load<T, A>(x, e) - (mean ? mean[row] : A(0)))}};
      },
      [=] __device__(int64_t row, const Sums<A, 2>& s) {
        coef[2 * row] = mean ? s.v[0] * inv_len : A(0);
        coef[2 * row + 1] = s.v[1] * rstd[row] * inv_len;
      });
}

// The same for spatial > 1, from per-plane sums that also give the parameter gradients.
template <class T, class A>
void plane_coefficients(const Launcher& launch, const GroupLayout& l, const T* grad_y, const T* x, const T* weight,
                        const A* mean, const A* rstd, A* coef, T* grad_weight, T* grad_bias) {
  const int64_t batch = l.batch, groups = l.groups, group_channels = l.group_channels, spatial = l.spatial;
  const int64_t channels = l.channels(), planes = batch * channels;
  const A inv_len = l.row_len() > 0 ? A(1) / static_cast<A>(l.row_len()) : A(0);
  // plane_sums[plane] = {sum(dy), sum(dy * (x - mean))} over the plane's spatial extent.
  const DeviceBuffer plane_buffer =
      launch.buffer(static_cast<size_t>(std::max<int64_t>(planes, 1)) * sizeof(Sums<A, 2>));
  Sums<A, 2>* plane_sums = plane_buffer.as<Sums<A, 2>>();
  reduce_rows<Sums<A, 2>>(
      launch, planes, spatial,
      [=] __device__(int64_t plane, int64_t s) {
        const int64_t e = plane * spatial + s;
        const A dy = load<T, A>(grad_y, e);
        return Sums<A, 2>{{dy, dy * (load<T, A>(x, e) - mean[plane / group_channels])}};
      },
      [=] __device__(int64_t plane, const Sums<A, 2>& s) { plane_sums[plane] = s; });
  for_each_index(launch, l.rows(), [=] __device__(int64_t row) {
    const int64_t first_channel = (row % groups) * group_channels;
    A sum_g = 0, sum_g_xc = 0;
    for (int64_t c = 0; c < group_channels; ++c) {
      const A w = weight ? load<T, A>(weight, first_channel + c) : A(1);
      const Sums<A, 2>& s = plane_sums[row * group_channels + c];
      sum_g += w * s.v[0];
      sum_g_xc += w * s.v[1];
    }
    coef[2 * row] = sum_g * inv_len;
    coef[2 * row + 1] = sum_g_xc * rstd[row] * inv_len;
  });
  param_grads_from_planes(launch, l, plane_buffer.as<const Sums<A, 2>>(), rstd, grad_weight, grad_bias);
}

template <class T>
void affine_backward(const char* op, const Tensor& grad_y_t, const Tensor& x_t, const Tensor& weight_t,
                     const Tensor& mean_t, const Tensor& rstd_t, const GroupLayout& l, const Tensor& grad_x_t,
                     const Tensor& grad_weight_t, const Tensor& grad_bias_t) {
  using A = compute_t<T>;
  const Launcher launch(op, x_t);
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  const T* weight = data_or_null<const T>(weight_t);
  const A* mean = data_or_null<const A>(mean_t);  // none: RMS norm
  const A* rstd = data_as<const A>(rstd_t);
  T* grad_x = data_as<T>(grad_x_t);
  T* grad_weight = data_or_null<T>(grad_weight_t);
  T* grad_bias = data_or_null<T>(grad_bias_t);
  const int64_t rows = l.rows(), row_len = l.row_len(), channels = l.channels();
  const int64_t batch = l.batch, groups = l.groups, group_channels = l.group_channels, spatial = l.spatial;
  const A inv_len = row_len > 0 ? A(1) / static_cast<A>(row_len) : A(0);
  const AffinePlan plan =
      plan_affine_backward(l, sizeof(T), is_aligned(grad_y, 16) && is_aligned(x, 16) && is_aligned(grad_x, 16),
                           aligned_or_null(weight), plan_limits<T>(launch, l));
  // coef[row] = {mean(w * dy), mean(w * dy * xhat)}, for the paths that keep them in memory.
  auto coefficients = [&] { return launch.buffer(static_cast<size_t>(std::max<int64_t>(rows, 1)) * 2 * sizeof(A)); };
  switch (plan.path) {
    case AffinePath::Rows:
      // grad_x, and the parameter gradients as per-block partials of the same pass.
      return with_row_team(plan, [&](auto team, auto vectors) {
        constexpr int kTeam = decltype(team)::value, kVecs = decltype(vectors)::value, V = 16 / sizeof(T);
        constexpr int threads = team_block<kTeam>();
        const int64_t wanted = ceil_div(rows, threads / kTeam);
        if (!grad_weight && !grad_bias) {
          auto kernel = layer_norm_rows_backward<T, kTeam, V, kVecs, false>;
          return launch(kernel, launch.resident_grid(kernel, threads, 0, wanted), threads, 0, rows, row_len, grad_y, x,
                        weight, mean, rstd, grad_x, nullptr, nullptr);
        }
        auto kernel = layer_norm_rows_backward<T, kTeam, V, kVecs, true>;
        const unsigned blocks = launch.resident_grid(kernel, threads, 0, wanted);
        const size_t partial_bytes = static_cast<size_t>(blocks) * static_cast<size_t>(row_len) * sizeof(A);
        const DeviceBuffer partial_w = launch.buffer(partial_bytes), partial_b = launch.buffer(partial_bytes);
        launch(kernel, blocks, threads, 0, rows, row_len, grad_y, x, weight, mean, rstd, grad_x, partial_w.as<A>(),
               partial_b.as<A>());
        sum_slices(launch, partial_w.as<const A>(), partial_b.as<const A>(), blocks, row_len, grad_weight, grad_bias);
      });
    case AffinePath::Columns: {
      // grad_x and the parameter gradients in one pass along columns.
      const DeviceBuffer coef = coefficients();
      row_coefficients(launch, l, grad_y, x, weight, mean, rstd, coef.as<A>());
      return with_vector<T>(plan.vector, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        const ColumnGrid g = column_grid_for(rows, row_len / V, launch.multiprocessors());
        const size_t partial_bytes = static_cast<size_t>(g.slices * row_len) * sizeof(A);
        const DeviceBuffer partial_w = launch.buffer(partial_bytes), partial_b = launch.buffer(partial_bytes);
        if (rows == 0) {
          NC_CUDA_CHECK(cudaMemsetAsync(partial_w.as<void>(), 0, partial_bytes, launch.stream()));
          NC_CUDA_CHECK(cudaMemsetAsync(partial_b.as<void>(), 0, partial_bytes, launch.stream()));
        } else if (row_len > 0) {
          launch(layer_norm_columns_backward<T, V>, g.grid, kThreads, 0, rows, row_len, g.rows_per_slice, grad_y, x,
                 weight, mean, rstd, coef.as<const A>(), grad_x, partial_w.as<A>(), partial_b.as<A>());
        }
        sum_slices(launch, partial_w.as<const A>(), partial_b.as<const A>(), g.slices, row_len, grad_weight, grad_bias);
      });
    }
    case AffinePath::Pipeline:
      if (spatial == 1) {
        const PipelineShape s = plan_pipeline(rows, row_len, row_len, sizeof(T), 2);
        const DeviceBuffer partials = launch.buffer(static_cast<size_t>(s.items) * sizeof(Sums<A, 2>));
        run_pipeline<2, T, Sums<A, 2>, RowInfo<A, 4>>(
            launch, s, x, grad_y, grad_x, partials.as<Sums<A, 2>>(),
            GradReduce<T, A, 2>{weight, mean, groups, group_channels, spatial}, GradFinish<A, 2>{mean, rstd, inv_len},
            GradApply<T, A>{weight, groups, group_channels, spatial});
        return column_param_grads(launch, l, grad_y, x, mean, rstd, grad_weight, grad_bias);
      } else {
        // Chunks lie within one plane, so the partials' plain sums are per (sample, channel).
        const PipelineShape s = plan_pipeline(rows, row_len, spatial, sizeof(T), 2);
        const DeviceBuffer partial_buffer = launch.buffer(static_cast<size_t>(s.items) * sizeof(Sums<A, 4>));
        const Sums<A, 4>* partials = partial_buffer.as<const Sums<A, 4>>();
        run_pipeline<2, T, Sums<A, 4>, RowInfo<A, 4>>(
            launch, s, x, grad_y, grad_x, partial_buffer.as<Sums<A, 4>>(),
            GradReduce<T, A, 4>{weight, mean, groups, group_channels, spatial}, GradFinish<A, 4>{mean, rstd, inv_len},
            GradApply<T, A>{weight, groups, group_channels, spatial});
        if (!grad_weight && !grad_bias) return;
        const int64_t chunks = s.chunks, pieces = s.pieces;
        return for_each_index(launch, channels, [=] __device__(int64_t c) {
          const int64_t group = c / group_channels, first = (c % group_channels) * pieces;
          A sum_w = 0, sum_b = 0;
          for (int64_t n = 0; n < batch; ++n) {
            const int64_t row = n * groups + group;
            A plane_w = 0;
            for (int64_t p = 0; p < pieces; ++p) {
              const Sums<A, 4>& part = partials[row * chunks + first + p];
              plane_w += part.v[3];
              sum_b += part.v[2];
            }
            sum_w += plane_w * rstd[row];
          }
          if (grad_weight) grad_weight[c] = convert<T>(sum_w);
          if (grad_bias) grad_bias[c] = convert<T>(sum_b);
        });
      }
    case AffinePath::SharedGroups: {
      const DeviceBuffer plane_buffer = launch.buffer(static_cast<size_t>(batch * channels) * sizeof(Sums<A, 2>));
      with_shared_group<T>(plan, [&](auto vec, auto block) {
        constexpr int V = decltype(vec)::value, threads = decltype(block)::value;
        const auto bytes = static_cast<size_t>(row_len) * sizeof(T) * 2;
        auto kernel = group_norm_shared_backward<T, V, threads>;
        launch.allow_shared_memory(kernel, bytes);
        launch(kernel, launch.resident_grid(kernel, threads, bytes, rows), threads, bytes, rows, row_len, groups,
               group_channels, spatial, grad_y, x, weight, mean, rstd, grad_x, plane_buffer.as<Sums<A, 2>>());
      });
      return param_grads_from_planes(launch, l, plane_buffer.as<const Sums<A, 2>>(), rstd, grad_weight, grad_bias);
    }
    case AffinePath::ClusterGroups: {
      const DeviceBuffer plane_buffer = launch.buffer(static_cast<size_t>(batch * channels) * sizeof(Sums<A, 2>));
      with_group_vector<T>(plan, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        const int64_t slice_vecs = ceil_div(row_len / V, plan.cluster);
        const int64_t slice_planes = slice_vecs * V / spatial + 2;  // at most, partly
        const auto bytes = static_cast<size_t>(2 * slice_vecs * V) * sizeof(T) +
                           static_cast<size_t>(slice_planes) * sizeof(Sums<A, 2>);
        auto kernel = group_norm_cluster_backward<T, V, kClusterThreads>;
        launch.allow_shared_memory(kernel, bytes);
        launch.clusters(kernel, static_cast<unsigned>(rows * plan.cluster), kClusterThreads, bytes, plan.cluster,
                        row_len, groups, group_channels, spatial, slice_vecs, grad_y, x, weight, mean, rstd, grad_x,
                        plane_buffer.as<Sums<A, 2>>());
      });
      return param_grads_from_planes(launch, l, plane_buffer.as<const Sums<A, 2>>(), rstd, grad_weight, grad_bias);
    }
    case AffinePath::Elementwise: {
      const DeviceBuffer coef = coefficients();
      if (spatial == 1) {
        row_coefficients(launch, l, grad_y, x, weight, mean, rstd, coef.as<A>());
        column_param_grads(launch, l, grad_y, x, mean, rstd, grad_weight, grad_bias);
      } else {
        plane_coefficients(launch, l, grad_y, x, weight, mean, rstd, coef.as<A>(), grad_weight, grad_bias);
      }
      const A* c = coef.as<const A>();
      return with_index_type(x_t.numel(), [&](auto index_tag) {
        using Index = decltype(index_tag);
        for_each_index<Index>(launch, x_t.numel(),
                              AffineGradInput<Index, T, A>{ElementPlace<Index>(l), grad_y, x, weight, mean, rstd, c,
                                                           grad_x});
      });
    }
  }
}

}  // namespace

void CudaNorms::layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t rows,
                                   int64_t row_len, double eps, const Tensor& y, const Tensor& mean,
                                   const Tensor& rstd) const {
  visit_float(x.dtype(), "layer_norm", [&](auto tag) {
    affine_forward<typename decltype(tag)::type>("layer_norm", x, weight, bias, layer_layout(rows, row_len), eps, y,
                                                 mean, rstd);
  });
}

void CudaNorms::layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                    const Tensor& rstd, int64_t rows, int64_t row_len, const Tensor& grad_x,
                                    const Tensor& grad_weight, const Tensor& grad_bias) const {
  visit_float(x.dtype(), "layer_norm backward", [&](auto tag) {
    affine_backward<typename decltype(tag)::type>("layer_norm backward", grad_y, x, weight, mean, rstd,
                                                  layer_layout(rows, row_len), grad_x, grad_weight, grad_bias);
  });
}

void CudaNorms::rms_norm_forward(const Tensor& x, const Tensor& weight, int64_t rows, int64_t row_len, double eps,
                                 const Tensor& y, const Tensor& rstd) const {
  visit_float(x.dtype(), "rms_norm", [&](auto tag) {
    affine_forward<typename decltype(tag)::type>("rms_norm", x, weight, Tensor(), layer_layout(rows, row_len), eps, y,
                                                 Tensor(), rstd);
  });
}

void CudaNorms::rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                                  int64_t rows, int64_t row_len, const Tensor& grad_x,
                                  const Tensor& grad_weight) const {
  visit_float(x.dtype(), "rms_norm backward", [&](auto tag) {
    affine_backward<typename decltype(tag)::type>("rms_norm backward", grad_y, x, weight, Tensor(), rstd,
                                                  layer_layout(rows, row_len), grad_x, grad_weight, Tensor());
  });
}

void CudaNorms::group_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const GroupLayout& l,
                                   double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) const {
  visit_float(x.dtype(), "group_norm", [&](auto tag) {
    affine_forward<typename decltype(tag)::type>("group_norm", x, weight, bias, l, eps, y, mean, rstd);
  });
}

void CudaNorms::group_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                    const Tensor& rstd, const GroupLayout& l, const Tensor& grad_x,
                                    const Tensor& grad_weight, const Tensor& grad_bias) const {
  visit_float(x.dtype(), "group_norm backward", [&](auto tag) {
    affine_backward<typename decltype(tag)::type>("group_norm backward", grad_y, x, weight, mean, rstd, l, grad_x,
                                                  grad_weight, grad_bias);
  });
}

}  // namespace cuda
}  // namespace normcore
